import CNghttp2
import Testing

@testable import HTTP2

/// The fields a connection lends nghttp2 for a request (`HTTP2HeaderBlock.withLentNghttp2Fields`): read once for the
/// requests that share a header block, and read again for another block, even one of the same size.
@Suite struct LentFieldsTests {
    @Test func aSharedBlockIsReadOnceAndAnotherBlockAgain() {
        func block(_ topic: String) -> HTTP2HeaderBlock {
            var block = HTTP2HeaderBlock(capacity: 0)
            block.add(":method", "POST")
            block.add(":authority", "api.push.apple.com")
            block.add("apns-topic", topic)
            return block
        }
        let path = HTTP2Path(prefix: "/3/device/", rest: "ab")
        var cache = Nghttp2FieldsCache()
        let first = block("com.example.one")
        let sameSize = block("com.example.two")
        for (blocks, expected) in [
            ([first, first], "com.example.one"), ([sameSize], "com.example.two"), ([first], "com.example.one")
        ] {
            for block in blocks {
                let lent = block.withLentNghttp2Fields(path: path, cache: &cache) { Self.fields($0, $1) }
                let read = block.withNghttp2Fields(lent: true, path: path) { Self.fields($0, $1) }
                #expect(lent == read)
                #expect(lent.first?.hasPrefix(":path: /3/device/ab") == true && lent.count == 4)
                #expect(lent.last?.hasPrefix("apns-topic: \(expected)") == true)
            }
        }
    }

    static func fields(_ fields: UnsafePointer<nghttp2_nv>, _ count: Int) -> [String] {
        (0..<count).map { index in
            let field = fields[index]
            let name = String(decoding: UnsafeBufferPointer(start: field.name, count: field.namelen), as: UTF8.self)
            let value = String(decoding: UnsafeBufferPointer(start: field.value, count: field.valuelen), as: UTF8.self)
            return "\(name): \(value)" + (field.flags == 0 ? "" : " (\(field.flags))")
        }
    }
}
