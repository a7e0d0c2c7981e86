import APNs
import Configuration
import Foundation
import HTTP2
import Operations
import Telemetry
import Testing
import WorkerPipeline

@Suite struct HistogramTests {
    @Test func countsFallIntoCumulativeBuckets() {
        let histogram = Histogram(bounds: [0.001, 0.01, 0.1])
        for nanoseconds: UInt64 in [500_000, 1_000_000, 5_000_000, 50_000_000, 2_000_000_000] {
            histogram.observe(nanoseconds: nanoseconds)
        }
        #expect(histogram.cumulativeCounts == [2, 3, 4, 5], "a bound is inclusive (le), the last is +Inf")
        var metrics = PrometheusText()
        metrics.histogram("latency_seconds", "Test.", histogram)
        let text = metrics.text
        #expect(text.contains("# TYPE latency_seconds histogram"))
        #expect(text.contains("latency_seconds_bucket{le=\"0.01\"} 3"))
        #expect(text.contains("latency_seconds_bucket{le=\"+Inf\"} 5"))
        #expect(text.contains("latency_seconds_count 5"))
        #expect(text.contains("latency_seconds_sum 2.0565"))
        var labelled = PrometheusText()
        labelled.histograms("lane_seconds", "Test.", [([("lane", "urgent")], histogram)])
        #expect(labelled.text.contains("lane_seconds_bucket{lane=\"urgent\",le=\"0.001\"} 2\n"))
        #expect(labelled.text.contains("lane_seconds_bucket{lane=\"urgent\",le=\"+Inf\"} 5\n"))
        #expect(labelled.text.contains("lane_seconds_count{lane=\"urgent\"} 5\n"))
        #expect(labelled.text.contains("lane_seconds_sum{lane=\"urgent\"} 2.0565"))
    }

    /// A long-running worker's total: months of a full lane's worth of notifications in flight, past where a total
    /// in nanoseconds overflowed and stopped the process; the sum keeps counting.
    @Test func theTotalOfALongRunKeepsCounting() {
        let histogram = Histogram()
        let month: UInt64 = 30 * 86_400 * 1_000_000_000
        for _ in 0..<5_000 { histogram.observe(nanoseconds: month) }
        #expect(histogram.cumulativeCounts.last == 5_000)
        #expect(abs(histogram.totalSeconds - 5_000 * 30 * 86_400) < 1, "\(histogram.totalSeconds)")
        let short = Histogram()
        short.observe(nanoseconds: 1_499)
        short.observe(nanoseconds: 1_500)
        #expect(abs(short.totalSeconds - 0.000_003) < 1e-9, "each rounded to microseconds: \(short.totalSeconds)")
    }

    @Test func labelValuesAreEscapedAsTheFormatWants() {
        var metrics = PrometheusText()
        metrics.family("answers_total", "counter", "Test.", [([("reason", "a\"b\\c\nd")], 2), ([], 1)])
        #expect(
            metrics.text == "# HELP answers_total Test.\n# TYPE answers_total counter\n"
                + "answers_total{reason=\"a\\\"b\\\\c\\nd\"} 2\nanswers_total 1\n")
    }
}

enum TemporaryText {
    static func file(_ text: String) throws -> String {
        let path = NSTemporaryDirectory() + "jobs-\(UUID().uuidString).jsonl"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
}
