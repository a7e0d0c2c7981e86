import Testing

@testable import HTTP2

/// The sweep that ends requests past the request timeout counts back from the monotonic clock, which starts at the
/// host's boot: a timeout longer than the host has been up must not take the client down.
@Suite struct RequestSweepTests {
    @Test func aCutoffBeforeTheClocksStartIsItsStart() {
        #expect(HTTP2Client.instant(30, before: 10_000_000_000) == 0, "10 s after boot, 30 s back")
        #expect(HTTP2Client.instant(86_400, before: 3_600_000_000_000) == 0, "an hour after boot, a day back")
        #expect(HTTP2Client.instant(30, before: 30_000_000_000) == 0)
    }

    @Test func aCutoffWithinTheClocksSpanIsThatMuchEarlier() {
        #expect(HTTP2Client.instant(30, before: 100_000_000_000) == 70_000_000_000)
        #expect(HTTP2Client.instant(0.25, before: 1_000_000_000) == 750_000_000)
    }
}
