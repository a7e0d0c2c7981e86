import APNs
import Configuration
import Foundation
import Operations
import Telemetry
import Testing
import WorkerPipeline

@testable import HTTP2

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

    /// Records of every size read back whole, in order, empty names and values included: those put together on the
    /// stack (the standard library's limit is 1,024 bytes, here a 1,012-byte value), larger ones on the heap, and a
    /// value cut at 65,535 bytes.
    @Test(arguments: [0, 1, 7, 250, 1_012, 1_013, 70_000])
    func recordsOfEverySizeReadBackWhole(valueLength: Int) {
        var block = HTTP2HeaderBlock(capacity: 16)
        let value = (0..<valueLength).map { UInt8(0x41 + $0 % 26) }
        let name = Array("x-field".utf8)
        let empty: [UInt8] = []
        name.withUnsafeBufferPointer { name in value.withUnsafeBufferPointer { block.add(raw: name, $0) } }
        empty.withUnsafeBufferPointer { nothing in block.add(raw: nothing, nothing, indexed: false) }
        block.add("after", "end")
        #expect(block.count == 3)
        let expected = String(decoding: value.prefix(65_535), as: UTF8.self)
        #expect(block.value("x-field") == expected, "a value longer than 65,535 bytes is cut there")
        #expect(block.fields.map(\.name) == ["x-field", "", "after"])
        #expect(block.fields.map(\.value).dropFirst() == ["", "end"])
        #expect(block.fields.map(\.indexed) == [true, false, true])
    }

    /// Every byte below 0x20 and DEL is found at every place of a value longer than the eight bytes read at once, and
    /// no other byte (0x80 and above included) is taken for one.
    @Test func controlCharactersAreFoundWhereverTheyAre() {
        for length in [1, 7, 8, 9, 23] {
            for position in 0..<length {
                for byte in UInt8.min...UInt8.max {
                    var value = [UInt8](repeating: 0x61, count: length)
                    value[position] = byte
                    let isControl = byte < 0x20 || byte == 0x7F
                    let found = value.withUnsafeBufferPointer(HTTP2Connection.hasControlCharacter)
                    #expect(found == isControl, "byte \(byte) at \(position) of \(length)")
                }
            }
        }
        let nothing: [UInt8] = []
        #expect(!nothing.withUnsafeBufferPointer(HTTP2Connection.hasControlCharacter))
        let high = [UInt8](repeating: 0xFF, count: 16) + [0x80, 0xA0, 0x9F, 0xC0]
        #expect(!high.withUnsafeBufferPointer(HTTP2Connection.hasControlCharacter), "bytes above 0x7F are not control")
    }
}
