/// Publish-to-answer latencies (microseconds) as counts in log-linear buckets: exact below 128 us, then 64 buckets
/// to each power of two, so a percentile is within 1/64 of the value it stands for. Recording is one increment and a
/// percentile one pass over 1,728 counts, whatever was recorded: `/sim/stats` is polled every few milliseconds by a
/// benchmark while millions of stamped pushes come in, and a sorted copy of every latency on each poll cost the
/// simulator more CPU than answering the pushes did.
struct LatencyHistogram: Sendable, Equatable {
    /// Values below this are counted exactly, one bucket each.
    private static let exactBelow: UInt32 = 128
    /// Buckets to each power of two from `exactBelow` on.
    private static let subBuckets = 64
    private static let bucketCount = Int(exactBelow) + (32 - 7) * subBuckets

    private var counts = [Int](repeating: 0, count: bucketCount)
    private(set) var count = 0
    private(set) var maximum: UInt32 = 0

    mutating func record(_ microseconds: UInt32) {
        counts[Self.bucket(of: microseconds)] += 1
        count += 1
        maximum = max(maximum, microseconds)
    }

    mutating func reset() { self = LatencyHistogram() }

    /// The latency below which `fraction` of those recorded fall (the one at rank `count * fraction`, as a sorted
    /// list would give it), within its bucket's width; 0 when none was recorded.
    func percentile(_ fraction: Double) -> UInt32 {
        guard count > 0 else { return 0 }
        let rank = min(count - 1, Int(Double(count) * fraction))
        var seen = 0
        for (index, bucketCount) in counts.enumerated() where bucketCount > 0 {
            seen += bucketCount
            if seen > rank { return min(Self.middle(of: index), maximum) }
        }
        return maximum
    }

    private static func bucket(of value: UInt32) -> Int {
        guard value >= exactBelow else { return Int(value) }
        let power = 31 - value.leadingZeroBitCount  // 7 or more
        let leading = Int(value >> UInt32(power - 6))  // the value's top seven bits: 64 to 127
        return Int(exactBelow) + (power - 7) * subBuckets + (leading - subBuckets)
    }

    /// The value a bucket stands for: itself below `exactBelow`, else the middle of the bucket's range.
    private static func middle(of index: Int) -> UInt32 {
        guard index >= Int(exactBelow) else { return UInt32(index) }
        let offset = index - Int(exactBelow)
        let power = offset / subBuckets + 7
        let lower = UInt64(offset % subBuckets + subBuckets) << UInt64(power - 6)
        let width = UInt64(1) << UInt64(power - 6)
        return UInt32(clamping: lower + width / 2)
    }
}
