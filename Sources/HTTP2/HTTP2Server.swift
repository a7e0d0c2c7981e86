import Synchronization
import TLS
import Telemetry
import Threads

#if canImport(Glibc)
    import Glibc
#endif

/// A TLS + HTTP/2 server (ALPN h2 only): the ground apns-sim stands on. Connections are spread over `loopCount`
/// event loops (threads), each connection served by one: a server that answers one busy connection does not make
/// the others wait for it, as APNs does not.
public final class HTTP2Server: PollHandler, @unchecked Sendable {
    // Invariant: `nextConnectionID` is touched only on the accepting loop's thread, each connection only on its own
    // loop's; `connections` is shared by the loops under its lock; the rest is immutable.
    public struct Configuration: Sendable {
        public var host: String
        public var port: Int
        public var certificatePEM: String
        public var privateKeyPEM: String
        public var maximumConcurrentStreams: UInt32
        /// Require TLS client certificates issued by (or equal to) this PEM certificate.
        public var clientCertificateCA: String?
        /// With `clientCertificateCA`: clients without a certificate are served too.
        public var clientCertificateOptional = false
        /// false: PINGs go unanswered, as from a peer that silently died.
        public var acknowledgesPings = true
        /// Event loops (threads) the connections are spread over, in the order they arrive.
        public var loopCount = 1

        public init(
            host: String = "127.0.0.1", port: Int = 0, certificatePEM: String, privateKeyPEM: String,
            maximumConcurrentStreams: UInt32 = 1000, clientCertificateCA: String? = nil
        ) {
            self.host = host
            self.port = port
            self.certificatePEM = certificatePEM
            self.privateKeyPEM = privateKeyPEM
            self.maximumConcurrentStreams = maximumConcurrentStreams
            self.clientCertificateCA = clientCertificateCA
        }
    }

    public let port: Int
    /// The loop that accepts connections (and serves the first, the n+1st, ...).
    public var loop: EventLoop { loops[0] }
    private let loops: [EventLoop]
    public let fileDescriptor: Int32
    private let tlsContext: TLSContext
    private let handler: HTTP2RequestHandler
    private let logger: Logger
    private let maximumConcurrentStreams: UInt32
    private let acknowledgesPings: Bool
    private let connections = Locked<[Int: HTTP2Connection]>([:])
    private var nextConnectionID = 1
    private let closedObserver = Locked<(@Sendable (Int) -> Void)?>(nil)
    private let handshakesCompleted = Atomic<Int>(0)

    /// Connections whose TLS handshake completed so far, whether or not they went on to carry a request.
    public var connectionsOpened: Int { handshakesCompleted.load(ordering: .relaxed) }

    /// Called on the connection's loop thread when a connection closes, with its id: per-connection state can go.
    public var onConnectionClosed: (@Sendable (Int) -> Void)? {
        get { closedObserver.withLock { $0 } }
        set { closedObserver.withLock { $0 = newValue } }
    }

    public init(configuration: Configuration, logger: Logger, handler: @escaping HTTP2RequestHandler) throws {
        tlsContext = try TLSContext.server(
            certificatePEM: configuration.certificatePEM,
            privateKeyPEM: configuration.privateKeyPEM,
            clientCertificateCA: configuration.clientCertificateCA,
            clientCertificateOptional: configuration.clientCertificateOptional)
        let listener = try ListeningSocket.open(host: configuration.host, port: configuration.port, nonBlocking: true)
        fileDescriptor = listener.descriptor
        port = listener.port
        self.handler = handler
        self.logger = logger
        maximumConcurrentStreams = configuration.maximumConcurrentStreams
        acknowledgesPings = configuration.acknowledgesPings
        loops = (0..<max(1, configuration.loopCount)).map { EventLoop(name: "http2-server-\($0)") }
        loop.execute { [self] in loop.register(self) }
    }

    /// Stops accepting, closes every open connection on its own loop, and ends the loops.
    public func shutdown() {
        // On the accepting loop, so that no connection is accepted after the list of open ones is taken; its own
        // connections are closed there and then, the others' close is queued on their loops, which end after it.
        loop.execute { [self] in
            loop.deregister(self)
            close(fileDescriptor)
            for connection in connections.withLock({ Array($0.values) }) {
                let reference = LoopThreadReference(connection: connection)
                if connection.loop === loop {
                    connection.close(reason: "server shut down")
                } else {
                    connection.loop.execute { reference.connection.close(reason: "server shut down") }
                }
            }
        }
        for loop in loops { loop.shutdown() }
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
                let owner = loops[(id - 1) % loops.count]
                let connection = HTTP2Connection(
                    id: id, loop: owner, fileDescriptor: client, tls: tls, role: .server(handler), connecting: false,
                    serverSettings: [(Int32(3), maximumConcurrentStreams)],  // SETTINGS_MAX_CONCURRENT_STREAMS
                    acknowledgesPings: acknowledgesPings)
                connection.onOpen = { [self] _ in handshakesCompleted.add(1, ordering: .relaxed) }
                connection.onClose = { [self] _, reason in
                    connections.withLock { $0[id] = nil }
                    logger.debug("connection closed", ["http2.connection": String(id), "http2.reason": reason])
                    onConnectionClosed?(id)
                }
                connections.withLock { $0[id] = connection }
                if owner === loop {
                    owner.register(connection)
                } else {
                    let reference = LoopThreadReference(connection: connection)
                    owner.execute { owner.register(reference.connection) }
                }
            } catch {
                logger.error("cannot accept a TLS connection", ["error": "\(error)"])
                close(client)
            }
        }
    }
}
