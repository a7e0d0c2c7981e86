import APNs
import Configuration
import Foundation
import HTTP2
import Operations
import Telemetry
import Testing
import WorkerPipeline

@Suite struct HeaderBlockTests {
    @Test func fieldsKeepTheirOrderValuesAndIndexing() {
        var shared = HTTP2HeaderBlock(capacity: 0)
        shared.add("apns-topic", "com.example.app")
        var block = HTTP2HeaderBlock.request(method: "POST", authority: "api.push.apple.com", path: "/3/device/ab")
        block.append(contentsOf: shared)
        block.add(":path", "/3/device/cd", indexed: false)
        #expect(block.count == 6)
        #expect(block.fields.map(\.name) == [":method", ":scheme", ":authority", ":path", "apns-topic", ":path"])
        #expect(block.value("apns-topic") == "com.example.app")
        #expect(block.value(":path") == "/3/device/ab", "the first of a name")
        #expect(block.value("apns-id") == nil && block.value("apns-topi") == nil, "names match whole")
        #expect(block.fields.last?.value == "/3/device/cd")
        #expect(
            block.fields.map(\.indexed) == [true, true, true, false, true, false],
            "unique values (paths) are never indexed")
    }
}
