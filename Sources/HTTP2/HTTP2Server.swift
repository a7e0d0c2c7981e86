#if canImport(Glibc)
import Glibc
#endif
import Telemetry

/// A TLS + HTTP/2 server (ALPN h2 only) on one event loop: the ground apns-sim stands on.
public final class HTTP2Server: PollHandler, @unchecked Sendable {
    // Invariant: `connections` and `nextConnectionID` are touched only on the loop thread; the rest is immutable.
    public struct Configuration: Sendable {
        public var host: String
        public var port: Int
        public var certificatePEM: String
        public var privateKeyPEM: String
        public var maximumConcurrentStreams: UInt32
        /// Require TLS client certificates issued by (or equal to) this PEM certificate.
        public var clientCertificateCA: String?
        /// false: PINGs go unanswered, as from a peer that silently died.
        public var acknowledgesPings = true

        public init(host: String = "127.0.0.1", port: Int = 0, certificatePEM: String, privateKeyPEM: String,
                    maximumConcurrentStreams: UInt32 = 1000, clientCertificateCA: String? = nil) {
            self.host = host
            self.port = port
            self.certificatePEM = certificatePEM
            self.privateKeyPEM = privateKeyPEM
            self.maximumConcurrentStreams = maximumConcurrentStreams
            self.clientCertificateCA = clientCertificateCA
        }
    }

    public let port: Int
    public let loop: EventLoop
    public let fileDescriptor: Int32
    private let tlsContext: TLSContext
    private let handler: HTTP2RequestHandler
    private let logger: Logger
    private let maximumConcurrentStreams: UInt32
    private let acknowledgesPings: Bool
    private var connections: [Int: HTTP2Connection] = [:]
    private var nextConnectionID = 1

    /// Called on the loop thread when a connection closes, with its id: per-connection state can go.
    public var onConnectionClosed: ((Int) -> Void)?

    public init(configuration: Configuration, logger: Logger, handler: @escaping HTTP2RequestHandler) throws {
        tlsContext = try TLSContext.server(certificatePEM: configuration.certificatePEM,
                                           privateKeyPEM: configuration.privateKeyPEM,
                                           clientCertificateCA: configuration.clientCertificateCA)
        let listener = try ListeningSocket.open(host: configuration.host, port: configuration.port, nonBlocking: true)
        fileDescriptor = listener.descriptor
        port = listener.port
        self.handler = handler
        self.logger = logger
        maximumConcurrentStreams = configuration.maximumConcurrentStreams
        acknowledgesPings = configuration.acknowledgesPings
        loop = EventLoop(name: "http2-server")
        loop.execute { [self] in loop.register(self) }
    }

    public func shutdown() {
        loop.execute { [self] in
            loop.deregister(self)
            for connection in connections.values { connection.close(reason: "server shut down") }
            close(fileDescriptor)
        }
        loop.shutdown()
    }

    public var pollEvents: Int16 { Int16(POLLIN) }

    public func handlePollEvents(_ events: Int16) {
        while true {
            let client = accept(fileDescriptor, nil, nil)
            guard client >= 0 else { return }
            Socket.configure(client)
            do {
                let tls = try TLSStream(context: tlsContext, fileDescriptor: client, serverName: nil)
                let id = nextConnectionID
                nextConnectionID += 1
                let connection = HTTP2Connection(
                    id: id, loop: loop, fileDescriptor: client, tls: tls, role: .server(handler), connecting: false,
                    serverSettings: [(Int32(3), maximumConcurrentStreams)],  // SETTINGS_MAX_CONCURRENT_STREAMS
                    acknowledgesPings: acknowledgesPings)
                connection.onClose = { [self] _, reason in
                    connections[id] = nil
                    logger.debug("connection closed", ["http2.connection": String(id), "http2.reason": reason])
                    onConnectionClosed?(id)
                }
                connections[id] = connection
                loop.register(connection)
            } catch {
                logger.error("cannot accept a TLS connection", ["error": "\(error)"])
                close(client)
            }
        }
    }
}
