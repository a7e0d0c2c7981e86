import Foundation
import Synchronization
import Telemetry
import Threads

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

/// Runs sessions until a stop is asked for: connects and serves; after a failure, waits with back-off (a wake-up
/// cuts the wait short) and connects again. The worker and the cleanup consumer both run on it.
public struct ReconnectLoop {
    public var logger: Logger
    public var wakeup: Wakeup
    public var stopRequested: () -> Bool

    public init(logger: Logger, wakeup: Wakeup, stopRequested: @escaping () -> Bool) {
        self.logger = logger
        self.wakeup = wakeup
        self.stopRequested = stopRequested
    }

    /// `session` connects and serves; it calls `connected()` once its connections are up, and returns true when it
    /// is done for good. After a failure, `giveUp` says what to throw instead of reconnecting (nil: reconnect), told
    /// whether any session had connected; `lost` runs first (readiness goes).
    public func run(
        session: (_ connected: () -> Void) throws -> Bool,
        giveUp: (_ error: any Error, _ connectedOnce: Bool) -> (any Error)?,
        lost: () -> Void = {}
    ) throws {
        var backoff = ReconnectBackoff()
        var connectedOnce = false
        while !stopRequested() {
            do {
                let done = try session {
                    connectedOnce = true
                    backoff.connected()
                }
                if done { return }
            } catch {
                lost()
                if let fatal = giveUp(error, connectedOnce) { throw fatal }
                let delay = backoff.failed()
                logger.error(
                    "broker or Redis unavailable; reconnecting",
                    [
                        "error": "\(error)",
                        "failures_in_a_row": String(backoff.failures),
                        "retry_in_s": String(format: "%.2f", delay)
                    ])
                wakeup.wait(timeout: delay)
            }
        }
    }
}

/// Readiness built on round trips: a program that consumes says it is ready only while its broker and store answered
/// within the last `window` seconds (a round trip each, `probeInterval` apart), so /readyz goes stale when either
/// stops answering, not only when a connection drops.
public final class RoundTripReadiness: Sendable {
    public static let window = 3.0
    public static let probeInterval = 1.0

    private let consuming = Atomic<Bool>(false)
    /// When the last round trips answered (monotonic nanoseconds).
    private let lastAnswered = Atomic<UInt64>(0)

    public init() {}

    public var isReady: Bool {
        let since = Double(DispatchTime.now().uptimeNanoseconds &- lastAnswered.load(ordering: .relaxed)) / 1e9
        return consuming.load(ordering: .relaxed) && since < Self.window
    }

    /// Whether a round trip is due (more than `probeInterval` since the last that answered).
    public var probeDue: Bool {
        Double(DispatchTime.now().uptimeNanoseconds &- lastAnswered.load(ordering: .relaxed)) / 1e9
            >= Self.probeInterval
    }

    /// The broker and the store just answered.
    public func answered() { lastAnswered.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed) }

    /// Consuming from now on (the connections just answered), or no longer.
    public func consuming(_ flag: Bool) {
        if flag { answered() }
        consuming.store(flag, ordering: .relaxed)
    }
}
