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

    /// Fifteen bytes announcing 2^31 - 1 elements are a promise: nothing is allocated for them, and the reader waits
    /// for the elements.
    @Test func anArrayCountIsNotTrustedBeforeItsElementsArrive() throws {
        let reader = RedisReplyReader(capacity: 8)
        Array("*2147483647\r\n:1\r\n".utf8).withUnsafeBytes { reader.feed($0) }
        #expect(try reader.next() == nil)
        #expect(reader.bufferCapacity <= 64)
    }

    /// A reply past the element bound (a user's hash of millions of tokens) costs that reply only: its elements are
    /// dropped as they arrive, never held, it reads as an error naming the bound, and the replies after it read as
    /// they are. Refusing it broke the connection, and with it every command of the batch, again on each new one.
    @Test(arguments: [1, 7, 4_096]) func aReplyPastTheElementBoundIsAnErrorReplyNotALostConnection(chunk: Int) throws {
        let reader = RedisReplyReader(capacity: 64, maximumElements: 4)
        var text = "*4\r\n:1\r\n:2\r\n:3\r\n:4\r\n"
        text += "*2000\r\n" + String(repeating: "$10\r\nproduction\r\n", count: 2_000)
        text += "*2\r\n*9\r\n" + String(repeating: ":7\r\n", count: 9) + "+OK\r\n"
        text += "*2\r\n$2\r\nab\r\n$1\r\nx\r\n"
        let bytes = Array(text.utf8)
        var read: [RedisReply] = []
        var largestBuffer = 0
        for start in stride(from: 0, to: bytes.count, by: chunk) {
            bytes[start..<min(start + chunk, bytes.count)].withUnsafeBytes { reader.feed($0) }
            largestBuffer = max(largestBuffer, reader.bufferCapacity)
            while let reply = try reader.next() { read.append(reply) }
        }
        #expect(read.count == 4)
        #expect(read.first == .array((1...4).map { .integer($0) }), "at the bound: read")
        #expect(
            read.dropFirst().first
                == .error("ERR reply dropped unread: an array of 2000 elements, more than the 4 this client reads"))
        #expect(
            read.dropFirst(2).first
                == .error("ERR reply dropped unread: an array of 9 elements, more than the 4 this client reads"),
            "nested past the bound: the whole reply dropped")
        #expect(read.last == .array([.string(Array("ab".utf8)), .string(Array("x".utf8))]), "the next reply as it is")
        #expect(largestBuffer <= 2 * max(64, chunk) + 64, "never held whole: \(largestBuffer) bytes")
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
