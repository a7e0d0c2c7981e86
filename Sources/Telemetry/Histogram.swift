import Synchronization

/// A Prometheus histogram of durations with fixed buckets, safe to observe from any thread without a lock
/// (one relaxed atomic add per observation, so it can sit on the per-notification path).
public final class Histogram: Sendable {
    /// Upper bounds in seconds: 1 ms to 10 s, the range of APNs answers from a good day to a bad one.
    public static let defaultBounds: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]
    private static let capacity = 16

    public let bounds: [Double]
    /// The bounds as a scrape writes them in `le` labels, formatted once.
    public let boundLabels: [String]
    /// Per bucket (not cumulative; `prometheusText` sums), the last one for observations above every bound.
    private let counts: InlineArray<16, Atomic<Int>>
    /// Microseconds, added wrapping: a worker's total grows by the notifications it has in flight each second (5,000
    /// by default), which in nanoseconds would pass Int64's range in about three weeks of running; in microseconds
    /// it takes over a century, and an addition never traps.
    private let totalMicroseconds = Atomic<UInt64>(0)

    public init(bounds: [Double] = Histogram.defaultBounds) {
        precondition(bounds.count < Self.capacity && bounds == bounds.sorted(), "at most 15 ascending bounds")
        self.bounds = bounds
        self.boundLabels = bounds.map { "\($0)" }
        self.counts = InlineArray { _ in Atomic(0) }
    }

    public func observe(nanoseconds: UInt64) {
        let seconds = Double(nanoseconds) / 1e9
        var bucket = 0
        while bucket < bounds.count && seconds > bounds[bucket] { bucket += 1 }
        counts[bucket].add(1, ordering: .relaxed)
        totalMicroseconds.wrappingAdd((nanoseconds &+ 500) / 1000, ordering: .relaxed)
    }

    /// Cumulative counts per bound, then +Inf, as Prometheus wants them.
    public var cumulativeCounts: [Int] {
        var running = 0
        return (0...bounds.count).map { bucket in
            running += counts[bucket].load(ordering: .relaxed)
            return running
        }
    }

    /// Everything observed, in seconds.
    public var totalSeconds: Double { Double(totalMicroseconds.load(ordering: .relaxed)) / 1e6 }
}
