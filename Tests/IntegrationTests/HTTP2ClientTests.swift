import APNs
import APNsSimulator
import Foundation
import HTTP2
import Synchronization
import Telemetry
import Testing

#if canImport(Glibc)
    import Glibc
    import Threads
#endif

/// The HTTP/2 + TLS client against apns-sim (our double) and against nghttpd (an independent server).
@Suite struct HTTP2ClientTests {
    let logger = Logger(label: "test", level: .critical)

    func collect(_ client: HTTP2Client, _ requests: [HTTP2Request]) -> [Result<HTTP2Response, HTTP2StreamError>] {
        let results = Locked<[Int: Result<HTTP2Response, HTTP2StreamError>]>([:])
        let done = DispatchSemaphore(value: 0)
        client.send(requests) { index, result in
            let complete = results.withLock { results in
                results[index] = result
                return results.count == requests.count
            }
            if complete { done.signal() }
        }
        #expect(
            done.wait(timeout: .now() + 30) == .success,
            "\(results.withLock { $0.count }) of \(requests.count) answered within 30 s")
        return results.withLock { results in (0..<requests.count).compactMap { results[$0] } }
    }

    func request(authority: String, token: String, topic: String = "com.example.app") -> HTTP2Request {
        var headers = HTTP2HeaderBlock.request(method: "POST", authority: authority, path: "/3/device/\(token)")
        headers.add("apns-topic", topic)
        headers.add("apns-push-type", "alert")
        return HTTP2Request(headers: headers, body: Array(#"{"aps":{"alert":"hi"}}"#.utf8))
    }

    /// Requests queued behind the server's stream limit whose deadline passes before their HEADERS went out are
    /// answered as timed out, and the connection goes on: the streams leave before their frames were sent, while
    /// nghttp2 holds their fields (lent to it, not copied) until it sends or drops those frames.
    /// A server that allows one stream at a time and never answers "/3/device/hold" (which keeps that stream until
    /// it times out), recording the paths that reach it, and a client of it that sends each request once.
    func oneStreamServer(requestTimeout: Double, paths: Locked<[String]> = Locked([])) throws -> (
        HTTP2Server, HTTP2Client
    ) {
        let pair = try SelfSignedCertificate.generate(commonName: "127.0.0.1")
        let server = try HTTP2Server(
            configuration: .init(
                certificatePEM: pair.certificatePEM,
                privateKeyPEM: pair.privateKeyPEM, maximumConcurrentStreams: 1),
            logger: logger
        ) { request, writer in
            paths.withLock { $0.append(request.path) }
            if !request.path.hasSuffix("/hold") { writer.respond(status: 200) }
        }
        let caFile = try TestServices.temporaryFile("ca", contents: pair.certificatePEM)
        do {
            let client = try HTTP2Client(
                configuration: .init(
                    host: "127.0.0.1", port: server.port, tls: .init(caFile: caFile),
                    requestTimeout: requestTimeout, maximumAttempts: 1),
                logger: logger)
            return (server, client)
        } catch {
            server.shutdown()
            throw error
        }
    }

    @Test func requestsQueuedBehindTheStreamLimitTimeOutAndTheConnectionGoesOn() throws {
        let (server, client) = try oneStreamServer(requestTimeout: 1)
        defer { server.shutdown() }
        defer { client.shutdown() }
        // First an answer: the server's SETTINGS (one stream at a time) are in before the queued requests go.
        #expect(try collect(client, [request(authority: client.authority, token: "first")])[0].get().status == 200)
        let queued = collect(
            client, ["hold", "second", "third"].map { request(authority: client.authority, token: $0) })
        #expect(queued.count == 3)
        for result in queued { #expect(result.failureCase == .timedOut, "\(result)") }
        #expect(try collect(client, [request(authority: client.authority, token: "after")])[0].get().status == 200)
    }

    /// A request whose send-by time comes while it waits behind the server's stream limit is dropped there, never
    /// sent, and answered `sendByPassed`; the connection goes on, its HPACK table in step with the server's (the
    /// dropped request's fields were never encoded), a new field included.
    @Test func aRequestWhoseSendByTimeComesBehindTheStreamLimitIsDroppedUnsent() throws {
        let paths = Locked<[String]>([])
        let (server, client) = try oneStreamServer(requestTimeout: 2, paths: paths)
        defer { server.shutdown() }
        defer { client.shutdown() }
        // First an answer: the server's SETTINGS (one stream at a time) are in before the others go.
        #expect(try collect(client, [request(authority: client.authority, token: "first")])[0].get().status == 200)
        var late = request(authority: client.authority, token: "late")
        late.sendBy = Date().timeIntervalSince1970 + 0.2
        let results = collect(client, [request(authority: client.authority, token: "hold"), late])
        #expect(results.map(\.failureCase) == [.timedOut, .sendByPassed], "\(results)")
        let after = collect(client, [request(authority: client.authority, token: "after", topic: "com.example.other")])
        #expect(try after[0].get().status == 200)
        #expect(
            paths.withLock { $0 } == ["/3/device/first", "/3/device/hold", "/3/device/after"],
            "the late request never reached the server")
    }

    @Test func manyConcurrentRequestsOverTwoConnectionsToTheSimulator() throws {
        let dead = "dead" + String(repeating: "0", count: 60)
        let simulator = try APNsSimulator(
            configuration: .init(unregisteredTokens: [dead: 1_732_900_000_123]),
            logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("sim-ca", contents: simulator.certificatePEM)
        let client = try HTTP2Client(
            configuration: .init(
                host: "127.0.0.1", port: simulator.port,
                tls: .init(caFile: caFile), connectionCount: 2),
            logger: logger)
        defer { client.shutdown() }
        var requests = (0..<2000).map { request(authority: client.authority, token: String(format: "%064x", $0)) }
        requests.append(request(authority: client.authority, token: dead))
        let results = collect(client, requests)
        #expect(results.count == 2001)
        let statuses = results.map { (try? $0.get().status) ?? -1 }
        #expect(statuses.prefix(2000).allSatisfy { $0 == 200 })
        let last = try results[2000].get()
        #expect(last.status == 410)
        #expect(APNsResponse.parseBody(last.body).timestamp == 1_732_900_000_123)
        #expect(simulator.received().count == 2001)
        #expect(Set(simulator.received().map(\.connectionID)).count == 2, "work is spread over both connections")
    }

    /// In a pool that may not grow (two connections, two at most), requests that find the open connection's streams
    /// all busy wait for the second, still in its handshake, instead of queueing behind the first: the second
    /// connection takes its share when it opens. The relay holds the second connection's handshake until the first
    /// is full; the server answers nothing until both carry requests.
    @Test func requestsWaitForAPoolsConnectionStillOpeningRatherThanQueueBehindAFullOne() throws {
        let pair = try SelfSignedCertificate.generate(commonName: "127.0.0.1")
        let held = Locked<[(connection: Int, writer: HTTP2ResponseWriter)]>([])
        let server = try HTTP2Server(
            configuration: .init(
                certificatePEM: pair.certificatePEM, privateKeyPEM: pair.privateKeyPEM, maximumConcurrentStreams: 10),
            logger: logger
        ) { request, writer in
            held.withLock { $0.append((request.connectionID, writer)) }
        }
        defer { server.shutdown() }
        let relay = try HoldingRelay(to: "127.0.0.1", port: server.port)
        defer { relay.cut() }
        relay.holdConnections(after: 1)
        let caFile = try TestServices.temporaryFile("ca", contents: pair.certificatePEM)
        let client = try HTTP2Client(
            configuration: .init(
                host: "127.0.0.1", port: relay.port, tls: .init(caFile: caFile), connectionCount: 2,
                maximumConnectionCount: 2),
            logger: logger)
        defer { client.shutdown() }
        let results = Locked<Int>(0)
        // More than the hundred streams a connection is assumed to take before its server's SETTINGS say ten.
        let requests = (0..<130).map { request(authority: client.authority, token: String(format: "%064x", $0)) }
        client.send(requests) { _, _ in results.withLock { $0 += 1 } }
        #expect(
            TestServices.waitUntil(timeout: 10) { held.withLock { $0.count } == 10 }, "the first connection is full")
        relay.releaseHeldConnections()
        #expect(
            TestServices.waitUntil(timeout: 10) { held.withLock { $0.count } == 20 },
            "the second connection took its share of what waited: \(held.withLock { $0.count }) requests arrived")
        #expect(Set(held.withLock { $0.map(\.connection) }).count == 2)
        // Answered from here on as they come: everything completes.
        func answerHeld() {
            let writers = held.withLock { held in
                defer { held.removeAll() }
                return held.map(\.writer)
            }
            server.loop.execute { for writer in writers { writer.respond(status: 200) } }
        }
        #expect(
            TestServices.waitUntil(timeout: 10) {
                answerHeld()
                return results.withLock { $0 } == 130
            }, "every request answered")
    }

    /// A host whose first addresses do not answer (one refuses, one is unreachable) still connects through the
    /// next, on the first try: the connection walks the addresses before the client backs off.
    @Test func triesEveryAddressOfTheHostInTurn() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("sim-ca", contents: simulator.certificatePEM)
        @Sendable func address(_ host: String, _ port: Int) -> sockaddr_storage {
            var storage = sockaddr_storage()
            withUnsafeMutableBytes(of: &storage) { raw in
                var inet = sockaddr_in()
                inet.sin_family = sa_family_t(AF_INET)
                inet.sin_port = in_port_t(UInt16(port).bigEndian)
                inet_pton(AF_INET, host, &inet.sin_addr)
                withUnsafeBytes(of: &inet) { raw.copyMemory(from: $0) }
            }
            return storage
        }
        let closedPort = TestServices.freePort()
        let events = Locked<[String]>([])
        var configuration = HTTP2Client.Configuration(
            host: "127.0.0.1", port: simulator.port, tls: .init(caFile: caFile),
            connectTimeout: 1, requestTimeout: 10)
        // 192.0.2.1 (TEST-NET-1) is routed nowhere: unreachable at once, or silent until the connect timeout.
        configuration.resolve = { _, port in
            [address("127.0.0.1", closedPort), address("192.0.2.1", port), address("127.0.0.1", port)]
        }
        configuration.observer = { event in events.withLock { $0.append("\(event)") } }
        let client = try HTTP2Client(configuration: configuration, logger: logger)
        defer { client.shutdown() }
        let results = collect(client, [request(authority: client.authority, token: String(repeating: "ab", count: 32))])
        #expect((try? results.first?.get().status) == 200, "\(results)")
        #expect(
            !events.withLock { $0 }.contains { $0.contains("connectFailed") }, "no back-off: \(events.withLock { $0 })")
    }

    @Test func refusesAServerItCannotVerify() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        // No CA file: the self-signed certificate is not in the system trust store.
        let client = try HTTP2Client(
            configuration: .init(host: "127.0.0.1", port: simulator.port, requestTimeout: 3),
            logger: logger)
        defer { client.shutdown() }
        let results = collect(client, [request(authority: client.authority, token: "abcd")])
        guard case .failure(let error)? = results.first else {
            Issue.record("an unverifiable server was accepted")
            return
        }
        #expect(error.description.contains("certificate") || error.description.contains("no connection"), "\(error)")
        #expect(simulator.received().isEmpty)
    }

    static let nghttpd =
        ["/usr/sbin/nghttpd", "/usr/bin/nghttpd"].first { FileManager.default.isExecutableFile(atPath: $0) }
        ?? "/usr/sbin/nghttpd"

    /// A new connection sends one stream until the server's SETTINGS say how many (nghttp2 would send a hundred):
    /// nghttpd allowing one, as APNs does until a request with a valid provider token was posted, refuses none of
    /// a burst of requests that waited for the connection (once its SETTINGS are acknowledged, a server may close the
    /// connection for a stream beyond them).
    @Test func aNewConnectionSendsOneStreamUntilTheServersSettings() throws {
        #expect(FileManager.default.isExecutableFile(atPath: Self.nghttpd), "nghttp2-server must be installed")
        let directory = try TestServices.certificateDirectory("nghttpd-one")
        let token = String(repeating: "c4", count: 32)
        try FileManager.default.createDirectory(atPath: directory + "/root/3/device", withIntermediateDirectories: true)
        #expect(FileManager.default.createFile(atPath: directory + "/root/3/device/\(token)", contents: Data()))
        let port = TestServices.freePort()
        let log = directory + "/frames.log"
        let server = try TestServices.Daemon(
            Self.nghttpd,
            [
                "--verbose", "--max-concurrent-streams=1", "--htdocs=\(directory)/root", "--address=127.0.0.1",
                "\(port)", "\(directory)/key.pem", "\(directory)/cert.pem"
            ], output: log)
        defer { server.stop() }
        let client = try HTTP2Client(
            configuration: .init(
                host: "127.0.0.1", port: port, tls: .init(caFile: directory + "/cert.pem"), requestTimeout: 10),
            logger: logger)
        defer { client.shutdown() }
        let results = collect(client, (0..<20).map { _ in request(authority: client.authority, token: token) })
        #expect(results.count == 20 && results.allSatisfy { (try? $0.get().status) == 200 })
        server.stop()
        let frames = try String(contentsOfFile: log, encoding: .utf8)
        #expect(frames.contains("SETTINGS_MAX_CONCURRENT_STREAMS(0x03):1"), "the server announced one stream")
        #expect(!frames.contains("REFUSED_STREAM"), "no stream was refused")
    }

    @Test func interoperatesWithNghttpd() throws {
        let nghttpd = Self.nghttpd
        #expect(
            FileManager.default.isExecutableFile(atPath: nghttpd),
            "nghttp2-server must be installed (scripts/test does)")
        let directory = try TestServices.certificateDirectory("nghttpd")
        let token = String(repeating: "c3", count: 32)
        try FileManager.default.createDirectory(atPath: directory + "/root/3/device", withIntermediateDirectories: true)
        #expect(FileManager.default.createFile(atPath: directory + "/root/3/device/\(token)", contents: Data()))
        let port = TestServices.freePort()
        let server = try TestServices.Daemon(
            nghttpd,
            [
                "--htdocs=\(directory)/root", "--address=127.0.0.1", "\(port)",
                "\(directory)/key.pem", "\(directory)/cert.pem"
            ])
        defer { server.stop() }

        let client = try HTTP2Client(
            configuration: .init(
                host: "127.0.0.1", port: port,
                tls: .init(caFile: directory + "/cert.pem"),
                requestTimeout: 10),
            logger: logger)
        defer { client.shutdown() }
        // The first requests may race nghttpd's start: the client reconnects with back-off until it listens.
        let results = collect(
            client,
            [
                request(authority: client.authority, token: token),
                request(authority: client.authority, token: "00ff")
            ])
        #expect(try results[0].get().status == 200)
        #expect(try results[1].get().status == 404)
        #expect(try results[0].get().header("server") != nil, "every field is kept by default")

        // A path given apart from a block of fields that two requests share goes out joined as the request's :path:
        // nghttpd finds the file under the one path and not under the other.
        var shared = HTTP2HeaderBlock(capacity: 0)
        shared.add(":method", "POST")
        shared.add(":scheme", "https")
        shared.add(":authority", client.authority)
        shared.add("apns-topic", "com.example.app")
        let body = Array(#"{"aps":{"alert":"hi"}}"#.utf8)
        let split = collect(
            client,
            [
                HTTP2Request(headers: shared, path: HTTP2Path(prefix: "/3/device/", rest: token), body: body),
                HTTP2Request(headers: shared, path: HTTP2Path(prefix: "/3/device/", rest: "00ff"), body: body)
            ])
        #expect(try split[0].get().status == 200)
        #expect(try split[1].get().status == 404)

        // A client that reads one field keeps that one only (the APNs client keeps apns-id and apns-unique-id).
        var onlyLength = client.configuration
        onlyLength.keptResponseHeaders = ["content-length"]
        let narrow = try HTTP2Client(configuration: onlyLength, logger: logger)
        defer { narrow.shutdown() }
        let answer = try collect(narrow, [request(authority: narrow.authority, token: token)])[0].get()
        #expect(answer.status == 200)
        #expect(answer.headers.map(\.name) == ["content-length"])

        // A successful answer may keep fewer fields than the others (the worker reads no delivered apns-id).
        var fewerOnSuccess = client.configuration
        fewerOnSuccess.keptResponseHeaders = ["content-length", "server"]
        fewerOnSuccess.keptSuccessResponseHeaders = ["server"]
        let lean = try HTTP2Client(configuration: fewerOnSuccess, logger: logger)
        defer { lean.shutdown() }
        let leanAnswers = collect(
            lean, [request(authority: lean.authority, token: token), request(authority: lean.authority, token: "00ff")])
        #expect(try leanAnswers[0].get().headers.map(\.name) == ["server"])
        #expect(try leanAnswers[1].get().status == 404)
        #expect(try Set(leanAnswers[1].get().headers.map(\.name)) == ["content-length", "server"])

        // A name of the same length is not the same name: the length only spares the others a comparison.
        var sameLength = client.configuration
        sameLength.keptResponseHeaders = ["content-lengtx"]
        let other = try HTTP2Client(configuration: sameLength, logger: logger)
        defer { other.shutdown() }
        let unkept = try collect(other, [request(authority: other.authority, token: token)])[0].get()
        #expect(unkept.status == 200, "the status is read whatever fields are kept")
        #expect(unkept.headers.isEmpty)
    }
}

extension Result {
    /// The error of a failure, nil for a success.
    var failureCase: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
