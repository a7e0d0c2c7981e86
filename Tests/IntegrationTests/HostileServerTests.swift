import Foundation
import Synchronization
import TLS
import Telemetry
import Testing

@testable import HTTP2

#if canImport(Glibc)
    import Glibc
    import Threads
#endif

/// Fuzzing what a server sends: a TLS + ALPN h2 server of the test's own answers each connection with a valid
/// SETTINGS frame followed by frames generated and mutated at random (responses, oversized header blocks, bodies
/// that are not JSON, GOAWAY, RST_STREAM, unknown types, truncated or corrupted frames, raw noise). The client
/// must answer every request, with a response or an error, within its deadline: no crash, no hang, no unbounded
/// memory. FUZZ_SERVER_CONNECTIONS (default 120) and FUZZ_SEED tune it.
@Suite struct HostileServerTests {
    static let connections = Int(ProcessInfo.processInfo.environment["FUZZ_SERVER_CONNECTIONS"] ?? "") ?? 120
    static let seed = UInt64(ProcessInfo.processInfo.environment["FUZZ_SEED"] ?? "") ?? 0x5EED_A9F5

    static func frame(type: UInt8, flags: UInt8, stream: UInt32, _ payload: [UInt8]) -> [UInt8] {
        let length = payload.count
        return [
            UInt8(truncatingIfNeeded: length >> 16), UInt8(truncatingIfNeeded: length >> 8),
            UInt8(truncatingIfNeeded: length),
            type, flags, UInt8(truncatingIfNeeded: stream >> 24), UInt8(truncatingIfNeeded: stream >> 16),
            UInt8(truncatingIfNeeded: stream >> 8), UInt8(truncatingIfNeeded: stream)
        ] + payload
    }

    /// HPACK: a literal field without indexing, new name (lengths below 127 only, no Huffman).
    static func literal(_ name: String, _ value: [UInt8]) -> [UInt8] {
        var bytes: [UInt8] = [0x00]
        bytes += hpackLength(name.utf8.count) + Array(name.utf8)
        bytes += hpackLength(value.count) + value
        return bytes
    }

    static func hpackLength(_ length: Int) -> [UInt8] {
        guard length >= 127 else { return [UInt8(length)] }
        var rest = length - 127
        var bytes: [UInt8] = [127]
        while rest >= 128 {
            bytes.append(UInt8(rest % 128 + 128))
            rest /= 128
        }
        return bytes + [UInt8(rest)]
    }

    /// What a server might send after its SETTINGS: the building blocks, then mutated.
    static func hostileFrames(using generator: inout SeededGenerator) -> [UInt8] {
        let status200: [UInt8] = [0x88]
        let status400: [UInt8] = [0x8C]  // static table index 12: ":status: 400"
        let blocks: [[UInt8]] = [
            frame(type: 1, flags: 5, stream: 1, status200),  // HEADERS, END_STREAM|END_HEADERS
            frame(type: 1, flags: 4, stream: 1, status400)
                + frame(type: 0, flags: 1, stream: 1, Array("<html>oops".utf8)),
            frame(type: 1, flags: 4, stream: 1, status200 + literal("apns-id", Array("x".utf8))),
            frame(type: 1, flags: 4, stream: 1, status200 + literal("x-big", [UInt8](repeating: 0x61, count: 70_000))),
            frame(type: 1, flags: 0, stream: 1, status200) + frame(type: 9, flags: 4, stream: 1, literal("a", [0x62])),
            frame(type: 0, flags: 1, stream: 1, [UInt8](repeating: 0x7B, count: 20_000)),
            frame(type: 3, flags: 0, stream: 1, [0, 0, 0, 2]),  // RST_STREAM INTERNAL_ERROR
            frame(type: 7, flags: 0, stream: 0, [0, 0, 0, 0, 0, 0, 0, 2] + Array("{\"reason\":\"Shutdown\"}".utf8)),
            frame(type: 6, flags: 0, stream: 0, [1, 2, 3, 4, 5, 6, 7, 8]),  // PING
            frame(type: 8, flags: 0, stream: 1, [0, 0, 0, 0]),  // WINDOW_UPDATE of 0
            frame(type: 4, flags: 0, stream: 0, [0, 3, 0, 0, 0, 1]),  // SETTINGS: MAX_CONCURRENT_STREAMS 1
            frame(type: 0xEE, flags: 0xFF, stream: 7, [1, 2, 3]),  // an unknown type
            frame(type: 1, flags: 4, stream: 99, status200),  // a stream the client never opened
            (0..<Int.random(in: 1...64, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        ]
        var bytes: [UInt8] = []
        for _ in 0..<Int.random(in: 1...4, using: &generator) { bytes += blocks.randomElement(using: &generator)! }
        for _ in 0..<Int.random(in: 0...3, using: &generator) where !bytes.isEmpty {
            switch Int.random(in: 0..<3, using: &generator) {
            case 0:
                bytes[Int.random(in: 0..<bytes.count, using: &generator)] ^= UInt8.random(
                    in: 1...255, using: &generator)
            case 1: bytes = Array(bytes.prefix(Int.random(in: 0..<bytes.count, using: &generator)))
            default:
                bytes.insert(
                    UInt8.random(in: 0...255, using: &generator), at: Int.random(in: 0..<bytes.count, using: &generator)
                )
            }
        }
        return bytes
    }

    /// Reads the client's preface and frames until its request's HEADERS (or the read timeout, or the end): an
    /// answer sent before it would be for a stream the client has not opened.
    static func readUntilRequest(_ tls: TLSStream, into buffer: inout [UInt8]) {
        var received: [UInt8] = []
        while true {
            let count = buffer.withUnsafeMutableBytes { tls.read(into: $0) }
            guard case .done(let read) = count, read > 0 else { return }
            received += buffer[..<read]
            var offset = 24  // the connection preface
            while offset + 9 <= received.count {
                if received[offset + 3] == 1 { return }  // HEADERS
                offset += 9 + (Int(received[offset]) << 16 | Int(received[offset + 1]) << 8 | Int(received[offset + 2]))
            }
        }
    }

    /// A server of the test's own: a connection per reply, one at a time, on a thread of its own with blocking
    /// calls, each answered with SETTINGS and its reply after the client's preface and request.
    static func serve(_ listener: Int32, context: TLSContext, replies: [[UInt8]]) -> DispatchSemaphore {
        let serverDone = DispatchSemaphore(value: 0)
        Thread {
            let settings = HostileServerTests.frame(type: 4, flags: 0, stream: 0, [])
            for reply in replies {
                let connection = accept(listener, nil, nil)
                guard connection >= 0 else { break }
                var timeout = timeval(tv_sec: 1, tv_usec: 0)
                setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
                if let tls = try? TLSStream(context: context, fileDescriptor: connection, serverName: nil),
                    case .done = tls.handshake()
                {
                    var buffer = [UInt8](repeating: 0, count: 16_384)
                    HostileServerTests.readUntilRequest(tls, into: &buffer)
                    let answer = settings + reply
                    var written = 0
                    while written < answer.count,
                        case .done(let count) = answer[written...].withUnsafeBytes({ tls.write($0) }), count > 0
                    {
                        written += count
                    }
                    _ = buffer.withUnsafeMutableBytes { tls.read(into: $0) }  // whatever the client says back
                    tls.shutdown()
                }
                close(connection)
            }
            serverDone.signal()
        }.start()
        return serverDone
    }

    /// A self-signed server identity, the file a client trusts it through, and a listening socket.
    static func listen() throws -> (context: TLSContext, caFile: String, listener: Int32, port: Int) {
        let pair = try SelfSignedCertificate.generate()
        let context = try TLSContext.server(certificatePEM: pair.certificatePEM, privateKeyPEM: pair.privateKeyPEM)
        let caFile = try TestServices.temporaryFile("hostile-ca.pem", contents: pair.certificatePEM)
        let (listener, port) = TestServices.listeningSocket()
        return (context, caFile, listener, port)
    }

    /// One request's end as `describe` puts it, or nil when it neither answered nor failed within 15 s.
    static func outcome(
        of client: HTTP2Client,
        _ describe: @escaping @Sendable (Result<HTTP2Response, HTTP2StreamError>) -> String
    ) -> String? {
        let answered = DispatchSemaphore(value: 0)
        let outcome = Locked("")
        client.send(
            HTTP2Request(
                headers: .request(method: "POST", authority: client.authority, path: "/3/device/ab"),
                body: Array("{}".utf8))
        ) { result in
            outcome.withLock { $0 = describe(result) }
            answered.signal()
        }
        return answered.wait(timeout: .now() + 15) == .success ? outcome.withLock { $0 } : nil
    }

    /// The client reads an answer's status and kept fields itself (nghttp2's HTTP checks are off for it): a status
    /// that is not three digits from 100 to 599 and a second final status (in trailers) reset the stream; interim (1xx) answers are skipped, their fields not kept, and one alone is no answer; a kept field
    /// whose value holds a line break is not kept, while the well-formed ones are.
    @Test func theClientChecksTheStatusAndTheFieldsItKeeps() throws {
        let (context, caFile, firstListener, _) = try Self.listen()
        close(firstListener)
        func headers(_ block: [UInt8], last: Bool = true) -> [UInt8] {
            Self.frame(type: 1, flags: last ? 5 : 4, stream: 1, block)
        }
        let answers: [[UInt8]] = [
            headers(Self.literal(":status", Array("2x0".utf8))), headers(Self.literal(":status", Array("700".utf8))),
            headers([0x88] + Self.literal("apns-id", Array("ab\r\nx-evil: 1".utf8))),
            headers([0x88] + Self.literal("apns-id", Array("0a1b2c3d-0000-4000-8000-000000000001".utf8))),
            headers(
                Self.literal(":status", Array("100".utf8)) + Self.literal("apns-id", Array("interim".utf8)), last: false
            )
                + headers([0x88] + Self.literal("apns-id", Array("final".utf8))),
            headers(Self.literal(":status", Array("103".utf8))),
            headers([0x88], last: false) + headers(Self.literal(":status", Array("410".utf8)))
        ]
        let loop = EventLoop(name: "checked-client")
        defer { loop.shutdown() }
        var outcomes: [String] = []
        for answer in answers {
            // A listener per answer: a client that reconnects after its answer cannot take the next one.
            let (listener, port) = TestServices.listeningSocket()
            defer { close(listener) }
            let serverDone = Self.serve(listener, context: context, replies: [answer])
            var configuration = HTTP2Client.Configuration(
                host: "127.0.0.1", port: port, tls: .init(caFile: caFile),
                connectTimeout: 5, requestTimeout: 5, maximumAttempts: 1)
            configuration.keptResponseHeaders = ["apns-id"]
            let client = try HTTP2Client(
                configuration: configuration, loop: loop, logger: Logger(label: "checked", level: .critical))
            let outcome = Self.outcome(of: client) { result in
                switch result {
                case .success(let response): "status \(response.status) apns-id \(response.header("apns-id") ?? "none")"
                case .failure(let error): "\(error)".split(separator: ":").first.map(String.init) ?? "error"
                }
            }
            client.shutdown()
            outcomes.append(outcome ?? "no end")
            #expect(serverDone.wait(timeout: .now() + 30) == .success)
        }
        let reset = "stream reset (HTTP/2 error 1)"
        #expect(
            outcomes == [
                reset, reset, "status 200 apns-id none", "status 200 apns-id 0a1b2c3d-0000-4000-8000-000000000001",
                "status 200 apns-id final", "connection lost", reset
            ], "\(outcomes)")
    }

    /// The names a client keeps when it keeps every field: HTTP/2's lower-case tokens, a colon only to begin with.
    @Test(arguments: [
        ("apns-id", true), (":status", true), ("x-b!g_#~", true), ("Apns-Id", false), ("a b", false),
        ("a:b", false), ("", false), ("a\r\nb", false), ("caf\u{e9}", false), ("a\"b", false)
    ])
    func fieldNamesAreHTTP2Tokens(name: String, valid: Bool) {
        #expect(Array(name.utf8).withUnsafeBufferPointer(HTTP2Connection.isFieldName) == valid, "\(name)")
    }

    @Test func everyRequestEndsWhateverTheServerSends() throws {
        let (context, caFile, listener, port) = try Self.listen()
        defer { close(listener) }

        var generator = SeededGenerator(state: Self.seed)
        let replies = (0..<Self.connections).map { _ in Self.hostileFrames(using: &generator) }
        let serverDone = Self.serve(listener, context: context, replies: replies)

        let loop = EventLoop(name: "hostile-client")
        defer { loop.shutdown() }
        var outcomes: [String: Int] = [:]
        for _ in 0..<Self.connections {
            let client = try HTTP2Client(
                configuration: .init(
                    host: "127.0.0.1", port: port, tls: .init(caFile: caFile),
                    connectTimeout: 5, requestTimeout: 0.5, maximumAttempts: 1),
                loop: loop, logger: Logger(label: "hostile", level: .critical))
            let outcome = Self.outcome(of: client) { result in
                switch result {
                case .success(let response): "status \(response.status)"
                case .failure(let error): "\(error)".split(separator: ":").first.map(String.init) ?? "error"
                }
            }
            #expect(outcome != nil, "a request got neither a response nor an error")
            client.shutdown()
            guard let outcome else { break }
            outcomes[outcome, default: 0] += 1
        }
        #expect(serverDone.wait(timeout: .now() + 30) == .success)
        #expect(outcomes.values.reduce(0, +) == Self.connections)
        print(
            "fuzz server replies: \(Self.connections) connections (seed \(Self.seed)), outcomes \(outcomes.sorted { $0.key < $1.key })"
        )
    }
}
