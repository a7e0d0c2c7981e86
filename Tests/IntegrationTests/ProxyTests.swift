import AMQP
import APNs
import APNsSimulator
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

/// A small HTTP CONNECT proxy on a loopback port: it records each CONNECT request (line and headers), answers 200 (or
/// 407 when it wants credentials that did not come) and relays bytes both ways. A dripping proxy sends its 200 one
/// byte every `dripping` seconds and relays nothing (a proxy that keeps a connection alive without answering).
final class ConnectProxy: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let requests = Locked<[String]>([])
    private let wantedAuthorization: String?
    private let dripping: Double?

    init(wantedAuthorization: String? = nil, dripping: Double? = nil) throws {
        self.wantedAuthorization = wantedAuthorization
        self.dripping = dripping
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        listen(listener, 16)
        var bound = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &bound) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        port = Int(UInt16(bigEndian: bound.sin_port))
        self.listener = listener
        Thread { [self] in
            while true {
                let client = accept(listener, nil, nil)
                guard client >= 0 else { return }
                Thread { [self] in serve(client) }.start()
            }
        }.start()
    }

    /// The CONNECT requests seen so far, each its request line and headers.
    var seen: [String] { requests.withLock { $0 } }

    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }

    private func serve(_ client: Int32) {
        var head: [UInt8] = []
        var byte: UInt8 = 0
        while !(head.count >= 4 && head.suffix(4) == [13, 10, 13, 10]), recv(client, &byte, 1, 0) == 1 {
            head.append(byte)
        }
        let request = String(decoding: head, as: UTF8.self)
        requests.withLock { $0.append(request) }
        if let dripping {
            for byte in "HTTP/1.1 200 Connection established\r\n\r\n".utf8 {
                guard [byte].withUnsafeBytes({ send(client, $0.baseAddress, 1, Int32(MSG_NOSIGNAL)) }) == 1 else {
                    break
                }
                usleep(UInt32(dripping * 1e6))
            }
            close(client)
            return
        }
        let words = request.split(separator: " ")
        guard words.count >= 2, words[0] == "CONNECT", let colon = words[1].lastIndex(of: ":"),
            let port = Int(words[1][words[1].index(after: colon)...])
        else {
            _ = "HTTP/1.1 400 Bad Request\r\n\r\n".withCString { send(client, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
            close(client)
            return
        }
        if let wanted = wantedAuthorization, !request.contains("Proxy-Authorization: \(wanted)\r\n") {
            _ = "HTTP/1.1 407 Proxy Authentication Required\r\n\r\n".withCString {
                send(client, $0, strlen($0), Int32(MSG_NOSIGNAL))
            }
            close(client)
            return
        }
        guard let upstream = try? Socket.connectBlocking(host: String(words[1][..<colon]), port: port, timeout: 5)
        else {
            _ = "HTTP/1.1 502 Bad Gateway\r\n\r\n".withCString { send(client, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
            close(client)
            return
        }
        _ = "HTTP/1.1 200 Connection established\r\nProxy-Agent: test\r\n\r\n".withCString {
            send(client, $0, strlen($0), Int32(MSG_NOSIGNAL))
        }
        // The blocking socket's receive timeout must not end a quiet tunnel.
        var forever = timeval(tv_sec: 0, tv_usec: 0)
        setsockopt(upstream, SOL_SOCKET, SO_RCVTIMEO, &forever, socklen_t(MemoryLayout<timeval>.size))
        Thread { Self.relay(from: upstream, to: client) }.start()
        Self.relay(from: client, to: upstream)
    }

    private static func relay(from source: Int32, to target: Int32) {
        var buffer = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(source, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { break }
            var sent = 0
            while sent < count {
                let written = buffer[sent..<count].withUnsafeBytes {
                    send(target, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
                }
                guard written > 0 else { break }
                sent += written
            }
        }
        shutdown(target, Int32(SHUT_WR))
        shutdown(source, Int32(SHUT_RD))
    }
}

/// APNS_PROXY_URL: the worker's APNs traffic goes through a CONNECT tunnel, TLS end to end inside it.
@Suite struct ProxyTests {
    let logger = Logger(label: "proxy", level: .critical)

    @Test func jobsReachAPNsThroughAConnectProxy() throws {
        let credentials = "Basic " + Data("egress:s3cret".utf8).base64EncodedString()
        let proxy = try ConnectProxy(wantedAuthorization: credentials)
        defer { proxy.stop() }
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let token = String(repeating: "9d", count: 32)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "APNS_PROXY_URL": "http://egress:s3cret@127.0.0.1:\(proxy.port)"
                ]), logger: logger)
        defer { worker.stop() }
        try publisher.publish(
            to: jobs, body: Array(#"{"id": "\#(jobs)", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        let summaries = try replyReader.read(1, timeout: 30)
        #expect(summaries.count == 1)
        #expect(simulator.received().map(\.deviceToken) == [token], "delivered through the tunnel")
        let connects = proxy.seen
        #expect(
            !connects.isEmpty
                && connects.allSatisfy { $0.hasPrefix("CONNECT 127.0.0.1:\(simulator.port) HTTP/1.1\r\n") },
            "the proxy saw the CONNECT: \(connects)")
        #expect(connects.allSatisfy { $0.contains("Proxy-Authorization: \(credentials)") })
    }

    /// A proxy that refuses the credentials: nothing is sent, the connect fails with the proxy's answer, and the
    /// password stays out of the error.
    @Test func aRefusedTunnelIsAFailedConnectThatKeepsThePasswordOut() throws {
        let proxy = try ConnectProxy(wantedAuthorization: "Basic something-else")
        defer { proxy.stop() }
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let failures = Locked<[String]>([])
        var configuration = APNsClientConfiguration(
            production: try APNsEndpoint(url: "https://127.0.0.1:\(simulator.port)"), requestTimeout: 2)
        configuration.caFile = try TestServices.temporaryFile("sim-ca", contents: simulator.certificatePEM)
        configuration.proxy = try APNsProxy("http://egress:t0ps3cret@127.0.0.1:\(proxy.port)")
        configuration.observer = { _, event in
            if case .connectFailed(let reason) = event { failures.withLock { $0.append(reason) } }
        }
        let client = APNsClient(
            configuration: configuration,
            authentication: .token(
                try APNsTokenProvider(
                    key: try ES256Key(pem: try ES256Key.generatePrivateKeyPEM()),
                    keyID: "KEY0000001", teamID: "TEAM000001")),
            logger: logger)
        defer { client.shutdown() }
        let answered = DispatchSemaphore(value: 0)
        let result = Locked<APNsResult?>(nil)
        client.send([
            APNsNotification(
                deviceToken: String(repeating: "9e", count: 32), topic: "com.example.app",
                payload: Array(#"{"aps":{}}"#.utf8))
        ]) { _, outcome in
            result.withLock { $0 = outcome }
            answered.signal()
        }
        #expect(answered.wait(timeout: .now() + 30) == .success, "an answer within the request timeout")
        #expect(simulator.received().isEmpty, "nothing reached APNs")
        let reasons = failures.withLock { $0 }
        #expect(reasons.contains { $0.contains("407") }, "\(reasons)")
        #expect(!reasons.contains { $0.contains("t0ps3cret") } && !proxy.seen.isEmpty)
        #expect(result.withLock { $0 }.map { "\($0)" }?.contains("t0ps3cret") == false)
    }

    /// A proxy that answers one byte at a time, each within the socket's timeout: the tunnel is given up when the
    /// connect timeout has passed in all, not after 43 bytes' worth of per-byte timeouts.
    @Test func aProxyThatDripsItsAnswerIsGivenUpAtTheConnectTimeout() throws {
        let proxy = try ConnectProxy(dripping: 0.2)
        defer { proxy.stop() }
        let started = DispatchTime.now()
        do {
            let tunnel = try HTTP2Proxy(host: "127.0.0.1", port: proxy.port).openTunnel(
                to: "127.0.0.1", port: 9, timeout: 1)
            close(tunnel)
            Issue.record("the tunnel opened after the dripped answer")
        } catch {
            #expect("\(error)".contains("did not finish answering CONNECT within 1.0 s"), "\(error)")
        }
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - started.uptimeNanoseconds) / 1e9
        #expect(seconds < 4, "given up after \(seconds) s, not at the end of the drip (8.6 s)")
    }
}
