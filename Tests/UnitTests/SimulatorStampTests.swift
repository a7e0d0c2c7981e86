import Testing

@testable import APNsSimulator

/// What apns-sim reads of a push without parsing it: the `sent_at_us` stamp of the benchmarks' latency figures, and
/// the token a device path names.
@Suite struct SimulatorStampTests {
    @Test func theStampIsFoundAfterOtherQuotedText() {
        let payload = Array(#"{"aps":{"alert":"a \"quoted\" word"},"sent_at_us":1765000000123456}"#.utf8)
        #expect(SimulatorCore.sentAtStamp(payload) == 1_765_000_000_123_456)
    }

    @Test func aPayloadWithoutAStampHasNone() {
        #expect(SimulatorCore.sentAtStamp(Array(#"{"aps":{"badge":1},"sent_at":5}"#.utf8)) == nil)
        #expect(SimulatorCore.sentAtStamp(Array(#"{"sent_at_us":"late"}"#.utf8)) == nil)
        // The marker with nothing after it, at the very end.
        #expect(SimulatorCore.sentAtStamp(Array(#"{"x":1,"sent_at_us":"#.utf8)) == nil)
        #expect(SimulatorCore.sentAtStamp([]) == nil)
    }

    /// A number too large for a stamp is none: read wrapping round, it came out negative and any client could make
    /// the latency's subtraction stop the simulator.
    @Test func aNumberTooLargeForAStampIsNone() {
        #expect(SimulatorCore.sentAtStamp(Array(#"{"sent_at_us":9223372036854775808}"#.utf8)) == nil)
        #expect(SimulatorCore.sentAtStamp(Array(#"{"sent_at_us":99999999999999999999}"#.utf8)) == nil)
        #expect(SimulatorCore.sentAtStamp(Array(#"{"sent_at_us":999999999999999999}"#.utf8)) == 999_999_999_999_999_999)
    }

    @Test func theMarkerIsMatchedWholeNotByItsFirstQuote() {
        // Quotes that start a shorter or different name come before the stamp.
        let payload = Array(#"{"sent":1,"sent_at":2,"sent_at_us":42}"#.utf8)
        #expect(SimulatorCore.sentAtStamp(payload) == 42)
    }

    @Test func aDevicePathNamesItsToken() {
        #expect(SimulatorCore.deviceToken(inPath: "/3/device/abc123") == "abc123")
        #expect(SimulatorCore.deviceToken(inPath: "/3/device/") == "")
        #expect(SimulatorCore.deviceToken(inPath: "/3/devices/abc") == "")
        #expect(SimulatorCore.deviceToken(inPath: "/3/device") == "")
        #expect(SimulatorCore.isDevicePath("/3/device/x"))
        #expect(!SimulatorCore.isDevicePath("/4/broadcasts/apps/x"))
    }
}
