import Foundation
import HTTP2
import Synchronization
import TLS
import Telemetry
import Threads

/// Where an APNs environment lives: `https://host[:port]` (443 or 2197 for Apple, anything for a private endpoint).
public struct APNsEndpoint: Sendable, Equatable {
    public var host: String
    public var port: Int

    public static let production = APNsEndpoint(host: "api.push.apple.com", port: 443)
    public static let sandbox = APNsEndpoint(host: "api.sandbox.push.apple.com", port: 443)

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    public init(url: String) throws(APNsConfigurationError) {
        guard url.hasPrefix("https://") else { throw .badURL(url, "must start with https://") }
        var rest = url.dropFirst("https://".count)
        if let slash = rest.firstIndex(of: "/") { rest = rest[..<slash] }
        var host = Substring(rest)
        var port = 443
        if host.hasPrefix("["), let close = host.firstIndex(of: "]") {  // [::1]:2197
            let after = host[host.index(after: close)...]
            if after.hasPrefix(":") {
                guard let parsed = Int(after.dropFirst()), (1...65535).contains(parsed) else {
                    throw .badURL(url, "bad port")
                }
                port = parsed
            }
            host = host[host.index(after: host.startIndex)..<close]
        } else if let colon = host.lastIndex(of: ":") {
            guard let parsed = Int(host[host.index(after: colon)...]), (1...65535).contains(parsed) else {
                throw .badURL(url, "bad port")
            }
            port = parsed
            host = host[..<colon]
        }
        guard !host.isEmpty else { throw .badURL(url, "no host") }
        self.host = String(host)
        self.port = port
    }
}

public enum APNsConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    case badURL(String, String)
    case noCredentials

    public var description: String {
        switch self {
        case .badURL(let url, let why): "APNs URL \(url): \(why)"
        case .noCredentials: "no APNs credentials: a signing key (token authentication) or a client certificate"
        }
    }
}

/// How the worker proves itself to APNs.
public enum APNsAuthentication: Sendable {
    /// A provider token (JWT) on every request.
    case token(APNsTokenProvider)
    /// A TLS client certificate: PEM certificate and its key (the key may sit in the certificate file).
    case certificate(certificateFile: String, privateKeyFile: String?)
}

public struct APNsClientConfiguration: Sendable {
    public var production: APNsEndpoint
    public var sandbox: APNsEndpoint
    /// Channel management (broadcast channels, iOS 18): a host of its own per environment.
    public var channelsProduction = APNsEndpoint(host: "api-manage-broadcast.push.apple.com", port: 2196)
    public var channelsSandbox = APNsEndpoint(host: "api-manage-broadcast.sandbox.push.apple.com", port: 2195)
    /// Extra CA bundle for private endpoints such as apns-sim.
    public var caFile: String?
    /// Peer verification; off only through an explicit setting, and logged loudly when off.
    public var verifyPeer: Bool
    /// Connections kept open per credential, environment and lane.
    public var connectionsPerEnvironment: Int
    /// Connections at most per credential, environment and lane: a pool whose streams are all busy while
    /// notifications wait opens more, up to this; those above `connectionsPerEnvironment` close after a minute idle.
    public var maximumConnectionsPerEnvironment: Int
    public var requestTimeout: Double
    /// PING after this many seconds without a frame from APNs (Apple: about an hour keeps a connection alive).
    public var pingInterval: Double
    /// A PING unanswered this long replaces the connection.
    public var pingTimeout: Double
    /// Connection events, for metrics and tests.
    public var observer: (@Sendable (APNsEnvironment, HTTP2ClientEvent) -> Void)?
    /// Every connection through this HTTP proxy's CONNECT tunnel (TLS to APNs end to end inside it).
    public var proxy: APNsProxy?
    /// Whether a delivered notification's answer keeps its `apns-id` (`APNsResponse.apnsID`). A caller that never
    /// reads it (the worker) sets false: an answer of Apple's production environment then keeps no field at all
    /// (`apns-unique-id`, which development answers and broadcasts carry, is kept either way).
    public var keepsDeliveredAPNsID = true

    public init(
        production: APNsEndpoint = .production, sandbox: APNsEndpoint = .sandbox, caFile: String? = nil,
        verifyPeer: Bool = true, connectionsPerEnvironment: Int = 1, maximumConnectionsPerEnvironment: Int? = nil,
        requestTimeout: Double = 30, pingInterval: Double = 3600, pingTimeout: Double = 15
    ) {
        self.production = production
        self.sandbox = sandbox
        self.caFile = caFile
        self.verifyPeer = verifyPeer
        self.connectionsPerEnvironment = connectionsPerEnvironment
        self.maximumConnectionsPerEnvironment = maximumConnectionsPerEnvironment ?? connectionsPerEnvironment
        self.requestTimeout = requestTimeout
        self.pingInterval = pingInterval
        self.pingTimeout = pingTimeout
        self.observer = nil
        self.proxy = nil
    }
}

extension APNsClientConfiguration {
    /// The HTTP/2 client of one pool's connections to `environment`: the endpoint, TLS with the identity
    /// `authentication` presents, the pool's size and timeouts, the proxy, and the answer fields kept.
    func connections(to environment: APNsEnvironment, as authentication: APNsAuthentication)
        -> HTTP2Client.Configuration
    {
        let endpoint = environment == .production ? production : sandbox
        var tls = TLSClientConfiguration(caFile: caFile, verifyPeer: verifyPeer)
        if case .certificate(let certificate, let privateKey) = authentication {
            tls.certificateFile = certificate
            tls.privateKeyFile = privateKey
        }
        // A stream lost with its connection is answered as lost, not sent again here: it may have been
        // delivered, and the pipeline's retries (APNS_MAX_ATTEMPTS in all) are the only ones that count sends.
        // Resent here as well, a notification went out three times in each of the pipeline's attempts.
        var client = HTTP2Client.Configuration(
            host: endpoint.host, port: endpoint.port, tls: tls, connectionCount: connectionsPerEnvironment,
            maximumConnectionCount: maximumConnectionsPerEnvironment, requestTimeout: requestTimeout,
            maximumAttempts: 1, pingInterval: pingInterval, pingTimeout: pingTimeout)
        client.proxy = proxy
        client.keptResponseHeaders = APNsResponse.headerNames
        if !keepsDeliveredAPNsID { client.keptSuccessResponseHeaders = APNsResponse.successHeaderNamesWithoutAPNsID }
        return client
    }
}
