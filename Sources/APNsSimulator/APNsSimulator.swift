import APNs
import Foundation
import HTTP2
import JSON
import Synchronization
import Telemetry
import Threads

/// An APNs double on the project's own HTTP/2 + TLS code: validates requests like APNs and answers like it.
public final class APNsSimulator: Sendable {
    public struct Configuration: Sendable {
        public var host: String
        public var port: Int
        /// PEM certificate and key to serve; a self-signed pair is made when nil.
        public var certificatePEM: String?
        public var privateKeyPEM: String?
        /// Tokens answered 410 Unregistered, with the time (ms since epoch) APNs learned they died.
        public var unregisteredTokens: [String: Int64]
        /// Provider-token checking: key id -> (team id, public key). Empty: any bearer token is accepted.
        public var trustedKeys: [String: TrustedKey]
        public var maximumConcurrentStreams: UInt32
        /// Threads the connections are spread over: as at APNs, a connection kept busy (a bulk sender's) does not
        /// make another wait for the server.
        public var threads = 1
        /// Keep every received notification for `received()` (tests); counters are always kept.
        public var recordsNotifications: Bool
        /// Count the distinct device tokens answered 200 (`/sim/stats` `accepted_distinct`): how fault runs tell
        /// deliveries from duplicates. Off by default: a set of tokens grows with every new one.
        public var countsDistinctAccepted = false
        /// Faults and answers scripted on top of APNs's rules; changeable at run time with `setBehaviour`.
        public var behaviour: Behaviour
        /// Certificate authentication: clients must present a TLS certificate issued by (or equal to) this one; with
        /// `trustedKeys` too, clients without a certificate use provider tokens instead. A certificate whose common
        /// name is a bundle ID, or "Apple Push Services: <bundle ID>" as Apple issues them, serves that app's topics
        /// only (TopicDisallowed for others).
        public var clientCertificateCA: String?
        /// Told about every push as it is judged, on the server's thread (tests wait on it). Keep it short.
        public var observer: (@Sendable (ReceivedNotification) -> Void)?
        /// Told about every broadcast it accepts (its channel id), before its answer leaves, on the server's thread.
        public var broadcastObserver: (@Sendable (String) -> Void)?
        /// Plays the development environment (api.sandbox.push.apple.com), whose answers also carry
        /// `apns-unique-id`; production's carry only `apns-id`.
        public var isDevelopment: Bool

        public init(
            host: String = "127.0.0.1", port: Int = 0, certificatePEM: String? = nil,
            privateKeyPEM: String? = nil, unregisteredTokens: [String: Int64] = [:],
            trustedKeys: [String: TrustedKey] = [:], maximumConcurrentStreams: UInt32 = 1000,
            recordsNotifications: Bool = true, behaviour: Behaviour = .init(), clientCertificateCA: String? = nil,
            isDevelopment: Bool = false
        ) {
            self.host = host
            self.port = port
            self.certificatePEM = certificatePEM
            self.privateKeyPEM = privateKeyPEM
            self.unregisteredTokens = unregisteredTokens
            self.trustedKeys = trustedKeys
            self.maximumConcurrentStreams = maximumConcurrentStreams
            self.recordsNotifications = recordsNotifications
            self.behaviour = behaviour
            self.clientCertificateCA = clientCertificateCA
            self.observer = nil
            self.broadcastObserver = nil
            self.isDevelopment = isDevelopment
        }
    }

    /// Which tokens a rule covers: one token, or every token starting with a prefix (a pattern ending in `*`).
    public struct TokenRule: Sendable, Equatable {
        public var pattern: String
        /// What the rule says of them: a topic, or an environment.
        public var value: String

        public init(pattern: String, value: String) {
            self.pattern = pattern
            self.value = value
        }

        public func covers(_ token: String) -> Bool {
            pattern.hasSuffix("*") ? token.hasPrefix(pattern.dropLast()) : token == pattern
        }
    }

    /// What the simulator does besides judging like APNs: the faults real deployments meet.
    public struct Behaviour: Sendable, Equatable {
        /// Token kinds, as APNs knows them: a token issued for a topic (an app's device token, a PushKit VoIP token,
        /// a Live Activity token) answers 400 DeviceTokenNotForTopic for any other topic. The first rule covering
        /// a token applies; tokens no rule covers serve any topic.
        public var tokenTopics: [TokenRule] = []
        /// Tokens of an environment (`production` or `sandbox`): those of the environment the simulator does not
        /// play (`isDevelopment` plays sandbox) answer 400 BadDeviceToken, as Apple's sandbox does for a
        /// production token.
        public var tokenEnvironments: [TokenRule] = []
        /// Answered 400 BadDeviceToken.
        public var badTokens: Set<String> = []
        /// Answered 429 TooManyRequests (too many pushes to one device).
        public var throttledTokens: Set<String> = []
        /// Pushes to these device tokens are answered 403 ExpiredProviderToken whatever the provider token (a
        /// provider whose clock APNs disagrees with).
        public var expiredProviderTokenFor: Set<String> = []
        /// The first n pushes to each of these tokens are answered 503 ServiceUnavailable, later ones normally.
        public var failFirstPushes: [String: Int] = [:]
        /// The first N broadcasts on any channel are answered 429 TooManyRequests (a busy APNs).
        public var throttleFirstBroadcasts = 0
        /// Broadcasts are answered 410 Unregistered (no answer Apple documents for a broadcast: what a worker makes
        /// of a device-only answer on another route).
        public var broadcastsGone = false
        /// Fraction of pushes answered 500 InternalServerError, and 503 ServiceUnavailable.
        public var internalErrorRate: Double = 0
        public var unavailableRate: Double = 0
        /// Seconds added before every answer.
        public var latency: Double = 0
        /// Up to this many seconds more, drawn per answer: answers then come back out of order, as APNs's do.
        public var latencyJitter: Double = 0
        /// After this many streams on a connection: GOAWAY (reason "Shutdown") after answering the last one.
        public var goAwayAfterStreams: Int?
        /// After this many streams on a connection, the next one's connection is dropped without an answer.
        public var dropConnectionAfterStreams: Int?
        /// Every n-th stream is reset with REFUSED_STREAM instead of answered.
        public var refuseEveryNthStream: Int?
        /// As APNs does: SETTINGS_MAX_CONCURRENT_STREAMS falls to 1 after a rejected push, and comes back after
        /// the next success.
        public var dropsStreamLimitAfterRejection = false
        /// PINGs go unanswered, as from a connection that silently died (fixed when the simulator starts).
        public var ignoresPings = false
        /// Until then (seconds since the epoch) every push is answered 500 InternalServerError: an outage of APNs,
        /// set at run time through `POST /sim/outage?seconds=N`.
        public var failingUntil: Double = 0

        public init() {}
    }

    public struct TrustedKey: Sendable {
        public var teamID: String
        public var key: ES256Key

        public init(teamID: String, key: ES256Key) {
            self.teamID = teamID
            self.key = key
        }
    }

    public let port: Int
    /// The certificate served, for clients to trust (APNS_CA_FILE).
    public let certificatePEM: String
    private let core: SimulatorCore
    private let server: Locked<HTTP2Server?> = Locked(nil)

    public init(configuration: Configuration, logger: Logger) throws {
        let pair: (certificatePEM: String, privateKeyPEM: String)
        if let certificate = configuration.certificatePEM, let key = configuration.privateKeyPEM {
            pair = (certificate, key)
        } else {
            pair = try SelfSignedCertificate.generate()
        }
        self.certificatePEM = pair.certificatePEM
        let core = SimulatorCore(configuration: configuration)
        self.core = core
        var serverConfiguration = HTTP2Server.Configuration(
            host: configuration.host, port: configuration.port, certificatePEM: pair.certificatePEM,
            privateKeyPEM: pair.privateKeyPEM, maximumConcurrentStreams: configuration.maximumConcurrentStreams,
            clientCertificateCA: configuration.clientCertificateCA)
        // Token and certificate authentication side by side, as on Apple's hosts: a client without a certificate
        // proves itself with provider tokens.
        serverConfiguration.clientCertificateOptional = !configuration.trustedKeys.isEmpty
        serverConfiguration.acknowledgesPings = !configuration.behaviour.ignoresPings
        serverConfiguration.loopCount = configuration.threads
        let server = try HTTP2Server(
            configuration: serverConfiguration,
            logger: logger
        ) { request, writer in core.handle(request, writer) }
        self.port = server.port
        self.server.withLock { $0 = server }
        server.onConnectionClosed = { id in core.state.withLock { _ = $0.connections.removeValue(forKey: id) } }
    }

    public func shutdown() {
        let server = self.server.withLock { server -> HTTP2Server? in
            defer { server = nil }
            return server
        }
        server?.shutdown()
    }

    /// Everything received so far, in arrival order.
    public func received() -> [ReceivedNotification] { core.state.withLock { $0.received } }

    /// Every provider token connections use now is expired from here on, as APNs answers once a token passed its hour:
    /// requests with them get 403 ExpiredProviderToken, and a connection may replace one at once (not an update too
    /// many). Returns the `iat`s expired.
    @discardableResult
    public func expireProviderTokensInUse() -> Set<Int64> {
        core.state.withLock { state in
            let inUse = Set(state.connections.values.compactMap(\.issuedAt))
            state.expiredIssuedAt.formUnion(inUse)
            return inUse
        }
    }

    /// Responses sent, by status.
    public func countsByStatus() -> [Int: Int] { core.countsByStatus() }
    /// Broadcasts accepted per channel id (channels deleted since included).
    public func broadcastsByChannel() -> [String: Int] { core.state.withLock { $0.broadcast.broadcastsByChannel } }

    public func setBehaviour(_ behaviour: Behaviour) { core.state.withLock { $0.behaviour = behaviour } }

    /// Connections that carried a request so far.
    public func connectionsSeen() -> Int { core.state.withLock { $0.connectionsSeen.count } }

    /// Connections that completed their TLS handshake so far, whether or not they carried a request: those a client
    /// opened ahead of its first push count too.
    public func connectionsOpened() -> Int { server.withLock { $0?.connectionsOpened ?? 0 } }
}
