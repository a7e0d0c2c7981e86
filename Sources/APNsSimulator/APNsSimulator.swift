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

/// The simulator's state and judgement, shared by the server's handler and the simulator's owner.
final class SimulatorCore: Sendable {
    struct State {
        var unregistered: [String: Int64]
        var received: [ReceivedNotification] = []
        var countsByStatus: [Int: Int] = [:]
        /// Pushes per credential that proved itself (`TEAMID/KEYID`, `certificate:<common name>`).
        var countsByCredential: [String: Int] = [:]
        /// Broadcast channels and what was broadcast on them.
        var broadcast = BroadcastChannels()
        var latencies: [UInt32] = []
        var ids = APNsIDGenerator()
        var behaviour: APNsSimulator.Behaviour
        var connections: [Int: ConnectionState] = [:]
        var connectionsSeen = Set<Int>()
        var pushesPerToken: [String: Int] = [:]
        var random = APNsIDGenerator(seed: 7)
        /// Device tokens answered 200, when the configuration counts them.
        var acceptedTokens = Set<String>()
        /// Provider tokens (by `iat`) declared expired before their hour (`expireProviderTokensInUse`).
        var expiredIssuedAt = Set<Int64>()
    }

    /// What APNs remembers about one connection.
    struct ConnectionState {
        var streams = 0
        var team: String?
        /// `TEAMID/KEYID` of the provider token verified on this connection.
        var credential: String?
        var authorization: String?
        var authorizationChangedAt: Double = 0
        /// The `iat` of `authorization`.
        var issuedAt: Int64?
        var limitedToOneStream = false
    }

    enum Fault {
        case drop, refuse
    }

    let configuration: APNsSimulator.Configuration
    let state: Locked<State>

    init(configuration: APNsSimulator.Configuration) {
        self.configuration = configuration
        self.state = Locked(State(unregistered: configuration.unregisteredTokens, behaviour: configuration.behaviour))
    }

    func countsByStatus() -> [Int: Int] { state.withLock { $0.countsByStatus } }
    func countsByCredential() -> [String: Int] { state.withLock { $0.countsByCredential } }

    /// Publish-to-answer latencies of notifications whose payload carries `"sent_at_us":<µs since the epoch>`
    /// (apns-bench stamps them at publish time), in microseconds.
    func latencies() -> [UInt32] { state.withLock { $0.latencies } }
    func resetLatencies() { state.withLock { $0.latencies.removeAll(keepingCapacity: true) } }

    /// The `sent_at_us` stamp in a payload, if any: a byte search, not a JSON parse (this runs per notification).
    private static let sentAtMarker = Array("\"sent_at_us\":".utf8)

    static func sentAtStamp(_ payload: [UInt8]) -> Int64? {
        let marker = sentAtMarker
        guard payload.count > marker.count else { return nil }
        return payload.withUnsafeBufferPointer { bytes -> Int64? in
            var index = 0
            while index + marker.count < bytes.count {
                if bytes[index] == marker[0] && memcmp(bytes.baseAddress! + index, marker, marker.count) == 0 {
                    var value: Int64 = 0
                    var position = index + marker.count
                    while position < bytes.count, bytes[position] >= 48, bytes[position] <= 57 {
                        value = value &* 10 &+ Int64(bytes[position] - 48)
                        position += 1
                    }
                    return position > index + marker.count ? value : nil
                }
                index += 1
            }
            return nil
        }
    }

    func handle(_ request: HTTP2ServerRequest, _ writer: HTTP2ResponseWriter) {
        let route = Self.route(request.path)
        switch route {
        case .control:
            handleControl(request, writer)
            return
        case .channels, .broadcast:
            handleBroadcastAPI(request, writer, route: route)
            return
        case .device, .unknown:
            handleDevicePush(request, writer)  // a path of no API is judged like a push: 404 BadPath
        }
    }

    /// A device push (`/3/device/<token>`), through the scripted faults, Apple's checks and the scripted answers.
    private func handleDevicePush(_ request: HTTP2ServerRequest, _ writer: HTTP2ResponseWriter) {
        let token = request.path.hasPrefix("/3/device/") ? String(request.path.dropFirst("/3/device/".count)) : ""
        let (behaviour, streamNumber, fault) = state.withLock { state -> (APNsSimulator.Behaviour, Int, Fault?) in
            state.connections[request.connectionID, default: ConnectionState()].streams += 1
            state.connectionsSeen.insert(request.connectionID)
            let number = state.connections[request.connectionID]!.streams
            let behaviour = state.behaviour
            if let limit = behaviour.dropConnectionAfterStreams, number > limit { return (behaviour, number, .drop) }
            if let every = behaviour.refuseEveryNthStream, every > 0, number % every == 0 {
                return (behaviour, number, .refuse)
            }
            return (behaviour, number, nil)
        }
        switch fault {
        case .drop?:
            writer.serverConnection.abort(reason: "dropped on purpose (--drop-after)")
            return
        case .refuse?:
            writer.reset(code: 7)  // REFUSED_STREAM: not processed, the client may send it again
            return
        case nil:
            break
        }
        // A connection with a verified client certificate is certificate-authenticated: no provider token needed.
        let certificate =
            configuration.clientCertificateCA == nil ? nil : writer.serverConnection.peerCertificateCommonName
        var (status, reason, timestamp) = judge(request, token: token, behaviour, certificate: certificate)
        if status == 200 { (status, reason) = scripted(token, behaviour) }
        let stamp = Self.sentAtStamp(request.body)
        let delay =
            behaviour.latency
            + (behaviour.latencyJitter > 0
                ? behaviour.latencyJitter * state.withLock { Double($0.random.nextFraction()) } : 0)
        let answeredAt = stamp == nil ? 0 : Int64(Date().timeIntervalSince1970 * 1e6) + Int64(delay * 1e6)
        let (apnsID, uniqueID, streamLimit, notification) = state.withLock { state in
            Self.note(
                request, token: token, status: status, reason: reason, certificate: certificate, stamp: stamp,
                answeredAt: answeredAt, behaviour: behaviour, configuration: configuration, in: &state)
        }
        if let notification { configuration.observer?(notification) }
        answer(
            writer, status: status, reason: reason, timestamp: timestamp, apnsID: apnsID, uniqueID: uniqueID,
            after: delay)
        if let streamLimit { writer.serverConnection.updateMaximumConcurrentStreams(streamLimit) }
        if let limit = behaviour.goAwayAfterStreams, streamNumber == limit {
            writer.serverConnection.goAway(
                code: 0, debugData: "{\"reason\":\"Shutdown\"}", lastStreamID: request.streamID)
        }
    }

    /// What the simulator keeps of one judged push (counts, latencies, the push itself, a connection's stream limit
    /// after a rejection): its apns-id, apns-unique-id, a new stream limit to announce, and the push as received.
    private static func note(
        _ request: HTTP2ServerRequest, token: String, status: Int, reason: APNsReason?,
        certificate: String?, stamp: Int64?, answeredAt: Int64, behaviour: APNsSimulator.Behaviour,
        configuration: APNsSimulator.Configuration, in state: inout State
    )
        -> (String, String, UInt32?, ReceivedNotification?)
    {

        state.countsByStatus[status, default: 0] += 1
        if status == 200 && configuration.countsDistinctAccepted { state.acceptedTokens.insert(token) }
        let credential = certificate.map { "certificate:" + $0 } ?? state.connections[request.connectionID]?.credential
        if let credential { state.countsByCredential[credential, default: 0] += 1 }
        if let sentAt = stamp, state.latencies.count < 4_000_000 {
            state.latencies.append(UInt32(clamping: max(0, answeredAt - sentAt)))
        }
        let given = request.header("apns-id")
        let apnsID = given.flatMap { AppleRules.isCanonicalUUID($0) ? $0 : nil } ?? state.ids.next()
        let uniqueID = state.ids.next()
        var notification: ReceivedNotification?
        if configuration.recordsNotifications || configuration.observer != nil {
            notification = ReceivedNotification(
                deviceToken: token, topic: request.header("apns-topic"), pushType: request.header("apns-push-type"),
                priority: request.header("apns-priority"), expiration: request.header("apns-expiration"),
                collapseID: request.header("apns-collapse-id"), apnsID: apnsID, payload: request.body,
                status: status, reason: reason?.rawValue, connectionID: request.connectionID,
                receivedAt: Date().timeIntervalSince1970, credential: credential,
                tokenIssuedAt: state.connections[request.connectionID]?.issuedAt)
            if configuration.recordsNotifications { state.received.append(notification!) }
        }
        var streamLimit: UInt32?
        if behaviour.dropsStreamLimitAfterRejection {
            let limited = state.connections[request.connectionID]?.limitedToOneStream ?? false
            if status != 200 && status != 410 && !limited {
                state.connections[request.connectionID]?.limitedToOneStream = true
                streamLimit = 1
            } else if status == 200 && limited {
                state.connections[request.connectionID]?.limitedToOneStream = false
                streamLimit = configuration.maximumConcurrentStreams
            }
        }
        return (apnsID, uniqueID, streamLimit, notification)
    }

    /// Apple's answer to a push: its apns-id (and apns-unique-id in development, the only environment that sends it),
    /// and for a refusal the reason's JSON; after `delay` seconds when the behaviour scripts latency.
    private func answer(
        _ writer: HTTP2ResponseWriter, status: Int, reason: APNsReason?, timestamp: Int64?,
        apnsID: String, uniqueID: String, after delay: Double
    ) {
        // Unique per answer: never indexed, so the connection's header table is not churned for nothing.
        var headers = [HTTP2Field(name: "apns-id", value: apnsID, indexed: false)]
        if configuration.isDevelopment {
            headers.append(HTTP2Field(name: "apns-unique-id", value: uniqueID, indexed: false))
        }
        var body: [UInt8] = []
        if let reason {
            var text = "{\"reason\":\"\(reason.rawValue)\""
            if let timestamp { text += ",\"timestamp\":\(timestamp)" }
            body = Array((text + "}").utf8)
            headers.append(HTTP2Field(name: "content-type", value: "application/json"))
        }
        if delay > 0 {
            writer.respond(after: delay, status: status, headers: headers, body: body)
        } else {
            writer.respond(status: status, headers: headers, body: body)
        }
    }

    /// The answers a behaviour scripts for a push APNs would have accepted.
    private func scripted(_ token: String, _ behaviour: APNsSimulator.Behaviour) -> (Int, APNsReason?) {
        if behaviour.failingUntil > 0 && Date().timeIntervalSince1970 < behaviour.failingUntil {
            return (500, .internalServerError)
        }
        if behaviour.badTokens.contains(token) { return (400, .badDeviceToken) }
        if behaviour.throttledTokens.contains(token) { return (429, .tooManyRequests) }
        if let failures = behaviour.failFirstPushes[token] {
            let seen = state.withLock { state in
                state.pushesPerToken[token, default: 0] += 1
                return state.pushesPerToken[token]!
            }
            if seen <= failures { return (503, .serviceUnavailable) }
        }
        if behaviour.internalErrorRate > 0 || behaviour.unavailableRate > 0 {
            let draw = state.withLock { state in Double(state.random.nextFraction()) }
            if draw < behaviour.internalErrorRate { return (500, .internalServerError) }
            if draw < behaviour.internalErrorRate + behaviour.unavailableRate { return (503, .serviceUnavailable) }
        }
        return (200, nil)
    }

    /// Apple's checks, in the order APNs is observed to apply them; nil reason means 200.
    private func judge(
        _ request: HTTP2ServerRequest, token: String, _ behaviour: APNsSimulator.Behaviour,
        certificate: String?
    ) -> (Int, APNsReason?, Int64?) {
        guard request.method == "POST" else { return (405, .methodNotAllowed, nil) }
        guard request.path.hasPrefix("/3/device/") else { return (404, .badPath, nil) }
        guard !token.isEmpty else { return (400, .missingDeviceToken, nil) }
        if !AppleRules.isDeviceToken(token) { return (400, .badDeviceToken, nil) }
        let playedEnvironment = configuration.isDevelopment ? "sandbox" : "production"
        if let environment = behaviour.tokenEnvironments.first(where: { $0.covers(token) })?.value,
            environment != playedEnvironment
        {
            return (400, .badDeviceToken, nil)
        }
        if certificate == nil, let failure = checkProviderToken(request) {
            return (failure == .tooManyProviderTokenUpdates ? 429 : 403, failure, nil)
        }
        guard let topic = request.header("apns-topic"), !topic.isEmpty else { return (400, .missingTopic, nil) }
        // A certificate serves its app's topics: Apple's common name is "Apple Push Services: <bundle ID>".
        if let certificate {
            let prefix = "Apple Push Services: "
            let bundle = certificate.hasPrefix(prefix) ? String(certificate.dropFirst(prefix.count)) : certificate
            if bundle.contains("."), APNsPushType.bundle(ofTopic: topic) != bundle {
                return (400, .topicDisallowed, nil)
            }
        }
        let pushType = request.header("apns-push-type") ?? "alert"
        guard let suffix = AppleRules.topicSuffixes[pushType] else { return (400, .invalidPushType, nil) }
        if !topic.hasSuffix(suffix) { return (400, .badTopic, nil) }
        if let tokenTopic = behaviour.tokenTopics.first(where: { $0.covers(token) })?.value, tokenTopic != topic {
            return (400, .deviceTokenNotForTopic, nil)
        }
        if let priority = request.header("apns-priority") {
            guard AppleRules.priorities.contains(priority) else { return (400, .badPriority, nil) }
            if pushType == "background" && priority == "10" { return (400, .badPriority, nil) }
        }
        if let id = request.header("apns-id"), !AppleRules.isCanonicalUUID(id) { return (400, .badMessageId, nil) }
        if let collapse = request.header("apns-collapse-id"), collapse.utf8.count > AppleRules.collapseIDLimit {
            return (400, .badCollapseId, nil)
        }
        if let expiration = request.header("apns-expiration"), Int64(expiration) == nil {
            return (400, .badExpirationDate, nil)
        }
        guard !request.body.isEmpty else { return (400, .payloadEmpty, nil) }
        if request.body.count > AppleRules.payloadLimit(pushType: pushType) { return (413, .payloadTooLarge, nil) }
        // Apple documents no reason for a body that is not a JSON object; APNs refuses it, so the simulator does too.
        guard case .object? = try? JSONReader.parse(request.body, allowsDuplicateKeys: true) else {
            return (400, APNsReason("BadPayload"), nil)
        }
        // What ActivityKit needs of a Live Activity push (event, timestamp, content-state); Apple documents no
        // reason for a payload it cannot use, so the simulator answers as for one that is not JSON.
        if pushType == "liveactivity" && !Self.isLiveActivityPayload(request.body, broadcast: false) {
            return (400, APNsReason("BadPayload"), nil)
        }
        if let died = state.withLock({ $0.unregistered[token] }) { return (410, .unregistered, died) }
        return (200, nil, nil)
    }

    /// With trusted keys configured: a bearer JWT signed ES256 by a known key for its team, not older than an hour,
    /// one team per connection, and a new token on a connection no more often than every 20 minutes.
    func checkProviderToken(_ request: HTTP2ServerRequest) -> APNsReason? {
        guard !configuration.trustedKeys.isEmpty else { return nil }
        guard let authorization = request.header("authorization"), authorization.hasPrefix("bearer ") else {
            return .missingProviderToken
        }
        let now = Date().timeIntervalSince1970
        let (known, expired) = state.withLock { state in
            let connection = state.connections[request.connectionID]
            return (connection?.authorization, connection?.issuedAt.map(state.expiredIssuedAt.contains) ?? false)
        }
        // Verified on this connection already.
        if known == authorization { return expired ? .expiredProviderToken : nil }
        let (team, keyID, issuedAt, failure) = verifyProviderToken(authorization, now: now)
        if let failure { return failure }
        return state.withLock { state -> APNsReason? in
            if let issuedAt, state.expiredIssuedAt.contains(issuedAt) { return .expiredProviderToken }
            var connection = state.connections[request.connectionID, default: ConnectionState()]
            defer { state.connections[request.connectionID] = connection }
            if let bound = connection.team, bound != team { return .unrelatedKeyIdInToken }  // one team per connection
            // Replacing a token APNs called expired is what it asks for, not an update too many.
            let replacesExpired = connection.issuedAt.map(state.expiredIssuedAt.contains) ?? false
            if connection.authorization != nil && now - connection.authorizationChangedAt < 20 * 60 && !replacesExpired
            {
                return .tooManyProviderTokenUpdates
            }
            connection.team = team
            connection.credential = "\(team ?? "")/\(keyID ?? "")"
            connection.authorization = authorization
            connection.authorizationChangedAt = now
            connection.issuedAt = issuedAt
            return nil
        }
    }

    private func verifyProviderToken(_ authorization: String, now: Double)
        -> (team: String?, keyID: String?, issuedAt: Int64?, failure: APNsReason?)
    {
        let parts = authorization.dropFirst("bearer ".count).split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3,
            let headerBytes = APNsTokenProvider.base64URLDecode(parts[0]),
            let claimsBytes = APNsTokenProvider.base64URLDecode(parts[1]),
            let signature = APNsTokenProvider.base64URLDecode(parts[2]),
            let header = try? JSONSerialization.jsonObject(with: Data(headerBytes)) as? [String: Any],
            let claims = try? JSONSerialization.jsonObject(with: Data(claimsBytes)) as? [String: Any],
            header["alg"] as? String == "ES256",
            let keyID = header["kid"] as? String, let issuer = claims["iss"] as? String,
            let issuedAt = (claims["iat"] as? NSNumber)?.int64Value
        else { return (nil, nil, nil, .invalidProviderToken) }
        guard let trusted = configuration.trustedKeys[keyID], trusted.teamID == issuer,
            trusted.key.verify(signature, of: Array((parts[0] + "." + parts[1]).utf8))
        else {
            return (nil, nil, nil, .invalidProviderToken)
        }
        if now - Double(issuedAt) > 3600 { return (nil, nil, issuedAt, .expiredProviderToken) }
        return (issuer, keyID, issuedAt, nil)
    }

    private func handleControl(_ request: HTTP2ServerRequest, _ writer: HTTP2ResponseWriter) {
        switch (request.method, request.path) {
        case ("GET", "/sim/stats"):
            let counts = countsByStatus()
            let total = counts.values.reduce(0, +)
            let byStatus = counts.keys.sorted().map { "\"\($0)\":\(counts[$0]!)" }.joined(separator: ",")
            let broadcasts = state.withLock { $0.broadcast.broadcastsByChannel }
            let byChannel = broadcasts.keys.sorted().map { "\(JSONString.quote($0)):\(broadcasts[$0]!)" }.joined(
                separator: ",")
            let credentials = countsByCredential()
            let byCredential = credentials.keys.sorted().map { "\(JSONString.quote($0)):\(credentials[$0]!)" }
                .joined(separator: ",")
            var latency = latencies()
            latency.sort()
            func percentile(_ fraction: Double) -> UInt32 {
                latency.isEmpty ? 0 : latency[min(latency.count - 1, Int(Double(latency.count) * fraction))]
            }
            let latencyText =
                "{\"count\":\(latency.count),\"p50\":\(percentile(0.5)),\"p99\":\(percentile(0.99)),"
                + "\"max\":\(latency.last ?? 0)}"
            let distinct =
                configuration.countsDistinctAccepted
                ? ",\"accepted_distinct\":\(state.withLock { $0.acceptedTokens.count })" : ""
            writer.respond(
                status: 200, headers: [HTTP2Field(name: "content-type", value: "application/json")],
                body: Array(
                    ("{\"received\":\(total),\"by_status\":{\(byStatus)},\"by_credential\":{\(byCredential)},\"broadcasts\":{\(byChannel)},"
                        + "\"latency_us\":\(latencyText)\(distinct)}\n").utf8))
        case ("POST", _) where request.path.hasPrefix("/sim/outage?seconds="):
            guard let seconds = Double(request.path.dropFirst("/sim/outage?seconds=".count)), seconds >= 0 else {
                writer.respond(status: 400, body: Array("{\"reason\":\"BadSeconds\"}".utf8))
                return
            }
            let until = Date().timeIntervalSince1970 + seconds
            state.withLock { $0.behaviour.failingUntil = until }
            writer.respond(status: 200)
        case ("POST", "/sim/reset-latency"):
            resetLatencies()
            writer.respond(status: 200)
        case ("POST", "/sim/goaway"):
            writer.respond(status: 200)
            writer.serverConnection.goAway(code: 0, debugData: "{\"reason\":\"Shutdown\"}", lastStreamID: nil)
        default:
            writer.respond(status: 404, body: Array("{\"reason\":\"BadPath\"}".utf8))
        }
    }
}
