import CRabbitMQ
import Testing

@testable import AMQP

/// A message's short strings (reply_to, correlation and message ids, header names) are sent on again with its
/// summary, its parked copy and its retries: what is read of them must fit AMQP's 255 bytes and keep ids apart.
@Suite struct AMQPShortStringTests {
    func read(_ bytes: [UInt8]) -> String {
        var bytes = bytes
        return bytes.withUnsafeMutableBytes { raw in
            AMQPConnection.shortString(amqp_bytes_t(len: raw.count, bytes: raw.baseAddress))
        }
    }

    @Test func textThatIsNotUTF8StaysWithinAShortStringAndKeepsIdsApart() {
        #expect(read(Array("café-42".utf8)) == "café-42", "UTF-8 as it is")
        let bad = read([UInt8](repeating: 0xFF, count: 86))
        #expect(bad.utf8.count <= 255 && bad.hasPrefix("%FF%FF"), "\(bad.utf8.count) bytes")
        #expect(read([0x41, 0xFF]) == "A%FF" && read([0x41, 0xFE]) == "A%FE", "two ids stay two")
        #expect(read([UInt8](repeating: 0xFF, count: 255)).utf8.count <= 255)
        #expect(read([0x25, 0xFF]) == "%25%FF", "a % of its own is escaped too")
        let long = [UInt8](repeating: 0xFF, count: 200)
        #expect(read(long + [0x41]) != read(long + [0x42]), "ids that differ past the cut stay two")
        #expect(read(long + [0x41]).utf8.count <= 255)
    }
}
