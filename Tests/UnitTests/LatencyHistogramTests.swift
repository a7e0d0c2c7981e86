import Testing

@testable import APNsSimulator

@Suite struct LatencyHistogramTests {
    @Test func valuesBelow128MicrosecondsAreExact() {
        var histogram = LatencyHistogram()
        for value in [5, 17, 17, 100, 127] as [UInt32] { histogram.record(value) }
        #expect(histogram.count == 5)
        #expect(histogram.percentile(0) == 5)
        #expect(histogram.percentile(0.5) == 17)
        #expect(histogram.percentile(0.99) == 127)
        #expect(histogram.maximum == 127)
    }

    /// Percentiles of a spread of latencies (1 us to about 4 s) stay within 1/64 of what the sorted list gives.
    @Test func percentilesStayWithinABucketOfTheSortedList() {
        var histogram = LatencyHistogram()
        var values: [UInt32] = []
        var value: UInt32 = 1
        for step in 0..<20_000 {
            value = (value &* 1_103_515_245 &+ 12_345) % 4_000_000
            let latency = step % 3 == 0 ? value % 300 : value
            values.append(latency)
            histogram.record(latency)
        }
        values.sort()
        for fraction in [0.1, 0.5, 0.9, 0.99, 0.999] {
            let expected = Double(values[min(values.count - 1, Int(Double(values.count) * fraction))])
            let reported = Double(histogram.percentile(fraction))
            #expect(abs(reported - expected) <= expected / 64 + 1, "p\(fraction * 100): \(reported) for \(expected)")
        }
        #expect(histogram.maximum == values.last)
        #expect(histogram.percentile(1) <= histogram.maximum)
    }

    @Test func theLargestLatenciesFitAndResetEmpties() {
        var histogram = LatencyHistogram()
        histogram.record(.max)
        histogram.record(1 << 31)
        #expect(Double(UInt32.max - histogram.percentile(0.99)) <= Double(UInt32.max) / 64)
        #expect(histogram.percentile(0) >= 1 << 31 && histogram.percentile(0) < UInt32.max)
        #expect(histogram.maximum == .max)
        histogram.reset()
        #expect(histogram.count == 0)
        #expect(histogram.percentile(0.5) == 0)
        #expect(histogram.maximum == 0)
    }
}
