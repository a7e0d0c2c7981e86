import Redis
import Testing

/// Replies as a connection reads them: whole or in pieces, and never trusting a count it has not received.
@Suite struct RedisReplyReaderTests {
    private func replies(_ text: String, chunk: Int) throws -> [RedisReply] {
        let reader = RedisReplyReader(capacity: 8)
        let bytes = Array(text.utf8)
        var replies: [RedisReply] = []
        for start in stride(from: 0, to: bytes.count, by: chunk) {
            bytes[start..<min(start + chunk, bytes.count)].withUnsafeBytes { reader.feed($0) }
            while let reply = try reader.next() { replies.append(reply) }
        }
        return replies
    }

    @Test(arguments: [1, 3, 1_000]) func repliesAreReadWhateverPiecesTheyArriveIn(chunk: Int) throws {
        let read = try replies("+OK\r\n:42\r\n$-1\r\n*2\r\n$5\r\nhello\r\n*1\r\n-ERR no\r\n$0\r\n\r\n", chunk: chunk)
        #expect(
            read == [
                .status("OK"), .integer(42), .null,
                .array([.string(Array("hello".utf8)), .array([.error("ERR no")])]), .string([])
            ])
    }

    /// Fifteen bytes announcing 2^31 - 1 elements would have the reader allocate 16 GB of element pointers at once:
    /// refused as an unreadable reply instead, before any element arrives.
    @Test func anArrayCountNoServerSendsIsRefusedBeforeItsElements() throws {
        #expect(throws: RedisError.self) { try replies("*2147483647\r\n", chunk: 100) }
        do {
            _ = try replies("*\(RedisReplyReader.maximumElements + 1)\r\n", chunk: 100)
            Issue.record("an array past the bound was accepted")
        } catch let error as RedisError {
            #expect(
                error.message.contains("more than \(RedisReplyReader.maximumElements) elements"), "\(error.message)")
        }
        let largest = try replies("*3\r\n:1\r\n:2\r\n:3\r\n", chunk: 4)
        #expect(largest == [.array([.integer(1), .integer(2), .integer(3)])])
    }

    @Test func bytesThatAreNotRESPAreAProtocolErrorThatSaysSo() throws {
        do {
            _ = try replies("HTTP/1.1 400 Bad Request\r\n\r\n", chunk: 100)
            Issue.record("an HTTP answer was read as a reply")
        } catch let error as RedisError {
            #expect(
                error.message.contains("unreadable reply") && error.message.contains("Protocol error")
                    && error.message.contains("\"H\""), "\(error.message)")
        }
    }

    /// A user's tokens are read where they arrived: every field and value handed out as bytes, whatever pieces the
    /// reply came in; a reply that is no hash comes back whole, so that its error can be told.
    @Test(arguments: [1, 5, 1_000]) func aHashIsHandedOutInPlaceFieldByField(chunk: Int) throws {
        let reader = RedisReplyReader(capacity: 8)
        let bytes = Array(
            "*4\r\n$2\r\nab\r\n$10\r\nproduction\r\n$2\r\ncd\r\n$0\r\n\r\n*0\r\n-WRONGTYPE no\r\n:3\r\n".utf8)
        var pairs: [String] = []
        var hashes: [RedisReplyReader.HashReply] = []
        for start in stride(from: 0, to: bytes.count, by: chunk) {
            bytes[start..<min(start + chunk, bytes.count)].withUnsafeBytes { reader.feed($0) }
            while let hash = try reader.nextHash({ field, value in
                pairs.append(String(decoding: field, as: UTF8.self) + "=" + String(decoding: value, as: UTF8.self))
            }) { hashes.append(hash) }
        }
        #expect(pairs == ["ab=production", "cd="])
        #expect(hashes == [.fields(2), .fields(0), .other(.error("WRONGTYPE no")), .other(.integer(3))])
    }

    /// A long reply that arrives in many small reads is read whole; arrays deeper than any reply Redis sends, and
    /// bulk strings longer than Redis allows, are refused before their bytes arrive.
    @Test func deepOrHugeRepliesAreRefusedAndLongOnesAreReadWhole() throws {
        let many = "*10000\r\n" + String(repeating: ":7\r\n", count: 10_000)
        let long = try replies(many, chunk: 3)
        #expect(long == [.array(Array(repeating: .integer(7), count: 10_000))])
        #expect(throws: RedisError.self) {
            try replies(String(repeating: "*1\r\n", count: RedisReplyReader.maximumDepth + 1), chunk: 100)
        }
        #expect(
            try replies(String(repeating: "*1\r\n", count: RedisReplyReader.maximumDepth) + ":1\r\n", chunk: 100).count
                == 1)
        #expect(throws: RedisError.self) { try replies("$\(RedisReplyReader.maximumBulkLength + 1)\r\n", chunk: 100) }
        #expect(throws: RedisError.self) { try replies(":12a\r\n", chunk: 100) }
        #expect(throws: RedisError.self) { try replies("$2\r\nabc\r\n", chunk: 100) }
    }
}
