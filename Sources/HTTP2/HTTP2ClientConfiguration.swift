import Foundation
import TLS

#if canImport(Glibc)
    import Glibc
#endif

/// What happened to a client's connections, for whoever watches (metrics, tests).
public enum HTTP2ClientEvent: Sendable, Equatable {
    case opened(connection: Int)
    case closed(connection: Int, reason: String)
    case goAway(connection: Int, lastStreamID: Int32, errorCode: UInt32, debugData: String)
    case pingAcknowledged(connection: Int)
    case connectFailed(reason: String)
}

extension HTTP2Client {
    public struct Configuration: Sendable {
        public var host: String
        public var port: Int
        public var tls: TLSClientConfiguration
        /// Connections kept open, busy or not.
        public var connectionCount: Int
        /// Connections at most, opened while every stream of the others is busy and requests wait.
        public var maximumConnectionCount: Int
        /// A connection above `connectionCount` with no stream and no frame received for this long closes.
        public var idleConnectionLifetime: Double = 60
        public var connectTimeout: Double
        /// How long a request may wait for its response, queueing included.
        public var requestTimeout: Double
        /// Sends of one request, counting the first, when streams are refused or connections lost.
        public var maximumAttempts: Int
        public var reconnectBaseDelay: Double
        public var reconnectMaximumDelay: Double
        /// A connection with no frame received for this long gets a PING (Apple: about an hour keeps it alive).
        public var pingInterval: Double
        /// A PING unanswered for this long means the connection is dead: it is replaced.
        public var pingTimeout: Double
        /// A connection with requests in flight and no frame received for this long gets a PING at once: a server
        /// answers in milliseconds, so silence while it owes answers is a link that died without a reset (a black
        /// hole). Replaced after `pingTimeout` more, its unanswered requests are lost: sent again on another connection
        /// up to `maximumAttempts` sends (the APNs pools send none again: the pipeline's retries count every send).
        public var busySilence: Double = 2
        /// Told about connection events on the loop thread (metrics, tests). Keep it short.
        public var observer: (@Sendable (HTTP2ClientEvent) -> Void)?
        /// Where the host is, asked afresh for every new connection (DNS; tests give addresses of their own). A
        /// connection tries each address in turn, in the order given, before the client backs off.
        public var resolve: @Sendable (String, Int) throws -> [sockaddr_storage]
        /// An HTTP proxy to tunnel through (CONNECT); TLS runs end to end inside the tunnel.
        public var proxy: HTTP2Proxy?
        /// The answer header fields kept in each `HTTP2Response` (lower-case names, as HTTP/2 writes them); nil keeps
        /// every one. A caller that reads two fields of an answer need not pay for storing a server's six.
        public var keptResponseHeaders: [String]?
        /// Those kept of a successful (2xx) answer, when a caller reads fewer of those than of the others; nil: as
        /// `keptResponseHeaders`. An answer that keeps no field allocates nothing for them.
        public var keptSuccessResponseHeaders: [String]?

        public init(
            host: String, port: Int, tls: TLSClientConfiguration = .init(), connectionCount: Int = 1,
            maximumConnectionCount: Int? = nil, connectTimeout: Double = 10, requestTimeout: Double = 30,
            maximumAttempts: Int = 3, reconnectBaseDelay: Double = 0.1, reconnectMaximumDelay: Double = 30,
            pingInterval: Double = 3600, pingTimeout: Double = 15
        ) {
            self.host = host
            self.port = port
            self.tls = tls
            self.connectionCount = max(1, connectionCount)
            self.maximumConnectionCount = max(self.connectionCount, maximumConnectionCount ?? connectionCount)
            self.connectTimeout = connectTimeout
            self.requestTimeout = requestTimeout
            self.maximumAttempts = max(1, maximumAttempts)
            self.reconnectBaseDelay = reconnectBaseDelay
            self.reconnectMaximumDelay = reconnectMaximumDelay
            self.pingInterval = pingInterval
            self.pingTimeout = pingTimeout
            self.observer = nil
            self.resolve = { host, port in try Socket.resolve(host: host, port: port) }
            self.proxy = nil
            self.keptResponseHeaders = nil
            self.keptSuccessResponseHeaders = nil
        }
    }
}
