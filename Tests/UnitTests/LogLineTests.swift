import Foundation
import Telemetry
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// What the logger writes, read back from a pipe it writes to.
@Suite struct LogLineTests {
    static func written(format: Logger.Format, _ log: (Logger) -> Void) throws -> String {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        defer { close(ends[0]) }
        log(Logger(label: "test", level: .info, format: format, fileDescriptor: ends[1]))
        close(ends[1])
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(ends[0], $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            bytes += buffer[..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// A value from outside (a job's id with a line break, a push type with a space) cannot begin a line of its own
    /// or run into the next field in the text format: such values are quoted with their control characters escaped,
    /// plain ones stay bare.
    @Test func aTextLineIsOneLineWhateverItsValuesHold() throws {
        let text = try Self.written(format: .text) { logger in
            logger.warning(
                "job rejected\nFORGED", ["job.id": "nl2\nINJECTED line", "apns.push_type": "smo ke", "amqp.tag": "7"])
        }
        #expect(text.split(separator: "\n").count == 1 && text.hasSuffix("\n"), "\(text)")
        #expect(text.contains(#"job.id="nl2\nINJECTED line""#), "\(text)")
        #expect(text.contains(#"apns.push_type="smo ke""#) && text.contains(" amqp.tag=7"), "\(text)")
        #expect(text.contains(#"job rejected\nFORGED"#), "\(text)")
    }
}
