import COpenSSL
import HTTP2
import Testing

@testable import TLS

#if canImport(Glibc)
    import Glibc
#endif

/// A TLS connection over a socket pair, both ends driven on this thread.
@Suite struct TLSStreamTests {
    /// A client and a server that finished their handshake, on non-blocking sockets.
    static func connectedPair() throws -> (client: TLSStream, server: TLSStream, sockets: [Int32]) {
        let pair = try SelfSignedCertificate.generate()
        let serverContext = try TLSContext.server(
            certificatePEM: pair.certificatePEM, privateKeyPEM: pair.privateKeyPEM)
        let clientContext = try TLSContext.client(TLSClientConfiguration(verifyPeer: false, applicationProtocols: []))
        var sockets: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &sockets) == 0)
        for socket in sockets { _ = fcntl(socket, F_SETFL, fcntl(socket, F_GETFL) | O_NONBLOCK) }
        let client = try TLSStream(context: clientContext, fileDescriptor: sockets[0], serverName: "localhost")
        let server = try TLSStream(context: serverContext, fileDescriptor: sockets[1], serverName: nil)
        var clientDone = false
        var serverDone = false
        // Each turn moves the handshake one flight on; a handful of them completes TLS 1.3.
        for _ in 0..<20 where !(clientDone && serverDone) {
            client.socketReadable()
            server.socketReadable()
            if case .done = client.handshake() { clientDone = true }
            if case .done = server.handshake() { serverDone = true }
        }
        try #require(clientDone && serverDone, "handshake finished")
        return (client, server, sockets)
    }

    /// An entry another caller of OpenSSL left in this thread's error queue (a PEM that does not parse).
    static func leaveAnErrorInTheQueue() {
        let garbage = Array("not a certificate".utf8)
        let bio = garbage.withUnsafeBytes { BIO_new_mem_buf($0.baseAddress, Int32($0.count)) }
        defer { BIO_free(bio) }
        #expect(PEM_read_bio_X509(bio, nil, nil, nil) == nil)
        #expect(ERR_peek_error() != 0, "an error is queued")
    }

    /// OpenSSL reads the thread's error queue to explain a call that did not succeed: an entry left there by
    /// anything else on the thread does not make a read with nothing to read, or one with data, fail.
    @Test func anErrorLeftInTheThreadsQueueFailsNoRead() throws {
        let (client, server, sockets) = try Self.connectedPair()
        defer { for socket in sockets { close(socket) } }
        var buffer = [UInt8](repeating: 0, count: 64)
        Self.leaveAnErrorInTheQueue()
        client.socketReadable()
        #expect(buffer.withUnsafeMutableBytes { client.read(into: $0) } == .wantRead)
        #expect(Array("hello".utf8).withUnsafeBytes { server.write($0) } == .done(5))
        Self.leaveAnErrorInTheQueue()
        client.socketReadable()
        #expect(buffer.withUnsafeMutableBytes { client.read(into: $0) } == .done(5))
        #expect(Array(buffer[..<5]) == Array("hello".utf8))
        #expect(ERR_peek_error() == 0, "the queue is left empty")
    }

    /// A read that truly fails (the peer sends what is no TLS record) is a failure that names its own cause, and
    /// leaves the queue empty, whether or not something else left an error in the thread's queue before.
    @Test(arguments: [false, true]) func aReadThatTrulyFailsIsAFailureThatNamesItsCause(stale: Bool) throws {
        let (client, _, sockets) = try Self.connectedPair()
        defer { for socket in sockets { close(socket) } }
        let garbage = [UInt8](repeating: 0x47, count: 64)
        #expect(garbage.withUnsafeBytes { write(sockets[1], $0.baseAddress, $0.count) } == 64)
        var buffer = [UInt8](repeating: 0, count: 64)
        if stale { Self.leaveAnErrorInTheQueue() }
        var result = TLSStream.IOResult.wantRead
        // The session tickets the server sent after its handshake come first.
        for _ in 0..<5 where result == .wantRead {
            client.socketReadable()
            result = buffer.withUnsafeMutableBytes { client.read(into: $0) }
        }
        guard case .failed(let message) = result else {
            Issue.record("expected a failure, got \(result)")
            return
        }
        #expect(message.hasPrefix("TLS read: ") && message.contains("wrong version number"), "\(message)")
        #expect(!message.contains("PEM"), "not the words another caller left: \(message)")
        #expect(!message.contains("certificate:"), "a certificate accepted unchecked is not named: \(message)")
        #expect(ERR_peek_error() == 0, "the queue is left empty")
    }

    /// The peer's close_notify is a closed connection, whatever another caller left in the thread's queue: alone,
    /// and behind data the same read drains first.
    @Test(arguments: [false, true]) func thePeersCloseIsAClosedConnection(afterData: Bool) throws {
        let (client, server, sockets) = try Self.connectedPair()
        defer { for socket in sockets { close(socket) } }
        if afterData { #expect(Array("last".utf8).withUnsafeBytes { server.write($0) } == .done(4)) }
        server.shutdown()
        var buffer = [UInt8](repeating: 0, count: 64)
        var results: [TLSStream.IOResult] = []
        // The session tickets the server sent after its handshake come first, then any data, then the close.
        for _ in 0..<6 where results.last != .closed {
            Self.leaveAnErrorInTheQueue()
            client.socketReadable()
            results.append(buffer.withUnsafeMutableBytes { client.read(into: $0) })
        }
        #expect(results.last == .closed, "\(results)")
        #expect(results.contains(.done(4)) == afterData, "\(results)")
        #expect(!results.contains { if case .failed = $0 { true } else { false } }, "\(results)")
        #expect(ERR_peek_error() == 0, "the queue is left empty")
    }
}
