import Foundation
import Telemetry

/// How long to wait before reconnecting to the broker or Redis after `failures` failures in a row: from 0.25 s
/// doubling up to 30 s, with equal jitter (`Backoff`).
public func reconnectDelay(afterFailures failures: Int) -> Double {
    Backoff.equalJitter(afterFailures: failures, base: 0.25, cap: 30)
}

/// Counts connection failures in a row. A session that fails soon after it was established is the same failure
/// recurring (a broker that accepts and then drops every connection, a fault that reappears on every batch), so it
/// keeps the count growing instead of starting it over: the back-off grows until a session has stayed up for
/// `stableAfter` seconds.
public struct ReconnectBackoff: Sendable {
    public private(set) var failures = 0
    public let stableAfter: Double
    private var connectedAt: Date?

    public init(stableAfter: Double = 30) {
        self.stableAfter = stableAfter
    }

    public mutating func connected(at now: Date = Date()) {
        connectedAt = now
    }

    /// Records a failure; returns the seconds to wait before the next attempt.
    public mutating func failed(at now: Date = Date()) -> Double {
        if let connectedAt, now.timeIntervalSince(connectedAt) >= stableAfter { failures = 0 }
        connectedAt = nil
        failures += 1
        return reconnectDelay(afterFailures: failures)
    }
}
