import Foundation

/// The back-off every reconnect waits: exponential with equal jitter. The ceiling doubles from `base` with each
/// failure in a row up to `cap`, and the wait is drawn between half the ceiling and the ceiling: never hammering
/// (at least half of the exponential wait), and a fleet that lost the same endpoint does not come back in step.
public enum Backoff {
    public static func equalJitter(afterFailures failures: Int, base: Double, cap: Double) -> Double {
        let exponent = Double(min(max(failures - 1, 0), 32))
        let ceiling = min(cap, base * pow(2, exponent))
        return Double.random(in: ceiling / 2...ceiling)
    }
}
