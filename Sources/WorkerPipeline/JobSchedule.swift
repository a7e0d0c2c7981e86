import Foundation

/// Jobs held until their `send_at`: durably, in the broker. A job not due yet is published again to the delay queue
/// of the longest tier that does not pass its time (persistent, confirmed before the delivery is acknowledged), and
/// comes back to its lane when that tier's TTL runs out; hop by hop it arrives at most a tier's rounding late.
/// Tiers double from 0.1 s, so a week is about 23 hops, and the last one leaves the job less than 0.1 s late.
public enum JobSchedule {
    /// The delay queues' TTLs, seconds: 0.1, 0.2, 0.4, ... 419,430.4 (4.9 days).
    public static let tiers: [Double] = (0...22).map { 0.1 * Double(1 << $0) }

    /// The tier to wait in for a job due in `remaining` seconds: the longest not longer than that, the shortest if
    /// even that is.
    static func delay(forRemaining remaining: Double) -> Double {
        tiers.last { $0 <= remaining } ?? tiers[0]
    }

    /// Whether a job with this `send_at` is due at `now` (UNIX seconds).
    static func isDue(_ sendAt: Int64?, now: Double) -> Bool {
        guard let sendAt else { return true }
        return Double(sendAt) <= now
    }
}
