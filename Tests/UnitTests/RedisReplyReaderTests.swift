import Redis
import Testing

/// Replies as the reader over TLS reads them: whole or in pieces, and never trusting a count it has not received.
@Suite struct RedisReplyReaderTests {
    private func replies(_ text: String, chunk: Int) throws -> [RedisReply] {
        let reader = try #require(RedisReplyReader())
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
        #expect(read == [.status("OK"), .integer(42), .null,
                         .array([.string(Array("hello".utf8)), .array([.error("ERR no")])]), .string([])])
    }

    /// Fifteen bytes announcing 2^31 - 1 elements would have the reader allocate 16 GB of element pointers at once:
    /// refused as an unreadable reply instead, before any element arrives.
    @Test func anArrayCountNoServerSendsIsRefusedBeforeItsElements() throws {
        #expect(throws: RedisError.self) { try replies("*2147483647\r\n", chunk: 100) }
        do {
            _ = try replies("*\(RedisReplyReader.maximumElements + 1)\r\n", chunk: 100)
            Issue.record("an array past the bound was accepted")
        } catch let error as RedisError {
            #expect(error.message.contains("more than \(RedisReplyReader.maximumElements) elements"), "\(error.message)")
        }
        let largest = try replies("*3\r\n:1\r\n:2\r\n:3\r\n", chunk: 4)
        #expect(largest == [.array([.integer(1), .integer(2), .integer(3)])])
    }

    @Test func bytesThatAreNotRESPAreAProtocolErrorThatSaysSo() throws {
        do {
            _ = try replies("HTTP/1.1 400 Bad Request\r\n\r\n", chunk: 100)
            Issue.record("an HTTP answer was read as a reply")
        } catch let error as RedisError {
            #expect(error.message.contains("unreadable reply") && error.message.contains("Protocol error"), "\(error.message)")
        }
    }
}
