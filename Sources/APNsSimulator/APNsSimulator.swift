import APNs
import Foundation
import HTTP2
import Synchronization
import Telemetry

/// What the simulator received: one accepted or rejected push, as APNs would have seen it.
public struct ReceivedNotification: Sendable, Equatable {
    public var deviceToken: String
    public var topic: String?
    public var pushType: String?
    public var priority: String?
    public var expiration: String?
    public var collapseID: String?
    public var apnsID: String
    public var payload: [UInt8]
    /// The status the simulator answered with.
    public var status: Int
    public var reason: String?
    public var connectionID: Int
}

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
        /// Keep every received notification for `received()` (tests); counters are always kept.
        public var recordsNotifications: Bool

        public init(host: String = "127.0.0.1", port: Int = 0, certificatePEM: String? = nil,
                    privateKeyPEM: String? = nil, unregisteredTokens: [String: Int64] = [:],
                    trustedKeys: [String: TrustedKey] = [:], maximumConcurrentStreams: UInt32 = 1000,
                    recordsNotifications: Bool = true) {
            self.host = host
            self.port = port
            self.certificatePEM = certificatePEM
            self.privateKeyPEM = privateKeyPEM
            self.unregisteredTokens = unregisteredTokens
            self.trustedKeys = trustedKeys
            self.maximumConcurrentStreams = maximumConcurrentStreams
            self.recordsNotifications = recordsNotifications
        }
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
    private let server: Mutex<HTTP2Server?> = Mutex(nil)

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
        let server = try HTTP2Server(
            configuration: .init(host: configuration.host, port: configuration.port,
                                 certificatePEM: pair.certificatePEM, privateKeyPEM: pair.privateKeyPEM,
                                 maximumConcurrentStreams: configuration.maximumConcurrentStreams),
            logger: logger) { request, writer in core.handle(request, writer) }
        self.port = server.port
        self.server.withLock { $0 = server }
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

    /// Responses sent, by status.
    public func countsByStatus() -> [Int: Int] { core.countsByStatus() }

    public func markUnregistered(_ token: String, at milliseconds: Int64) {
        core.state.withLock { $0.unregistered[token] = milliseconds }
    }
}

/// The simulator's state and judgement, shared by the server's handler and the simulator's owner.
private final class SimulatorCore: Sendable {
    struct State {
        var unregistered: [String: Int64]
        var received: [ReceivedNotification] = []
        var countsByStatus: [Int: Int] = [:]
        var ids = APNsIDGenerator()
    }

    let configuration: APNsSimulator.Configuration
    let state: Mutex<State>

    init(configuration: APNsSimulator.Configuration) {
        self.configuration = configuration
        self.state = Mutex(State(unregistered: configuration.unregisteredTokens))
    }

    func countsByStatus() -> [Int: Int] { state.withLock { $0.countsByStatus } }

    func handle(_ request: HTTP2ServerRequest, _ writer: HTTP2ResponseWriter) {
        if request.path.hasPrefix("/sim/") {
            handleControl(request, writer)
            return
        }
        let token = request.path.hasPrefix("/3/device/") ? String(request.path.dropFirst("/3/device/".count)) : ""
        let (status, reason, timestamp) = judge(request, token: token)
        let (apnsID, uniqueID) = state.withLock { state -> (String, String) in
            state.countsByStatus[status, default: 0] += 1
            let apnsID = request.header("apns-id") ?? state.ids.next()
            let uniqueID = state.ids.next()
            if configuration.recordsNotifications {
                state.received.append(ReceivedNotification(
                    deviceToken: token, topic: request.header("apns-topic"), pushType: request.header("apns-push-type"),
                    priority: request.header("apns-priority"), expiration: request.header("apns-expiration"),
                    collapseID: request.header("apns-collapse-id"), apnsID: apnsID, payload: request.body,
                    status: status, reason: reason?.rawValue, connectionID: request.connectionID))
            }
            return (apnsID, uniqueID)
        }
        var headers = [HTTP2Field(name: "apns-id", value: apnsID)]
        headers.append(HTTP2Field(name: "apns-unique-id", value: uniqueID))
        guard let reason else {
            writer.respond(status: status, headers: headers)
            return
        }
        var body = "{\"reason\":\"\(reason.rawValue)\""
        if let timestamp { body += ",\"timestamp\":\(timestamp)" }
        body += "}"
        headers.append(HTTP2Field(name: "content-type", value: "application/json"))
        writer.respond(status: status, headers: headers, body: Array(body.utf8))
    }

    /// Apple's checks, in the order APNs is observed to apply them; nil reason means 200.
    private func judge(_ request: HTTP2ServerRequest, token: String) -> (Int, APNsReason?, Int64?) {
        guard request.method == "POST" else { return (405, .methodNotAllowed, nil) }
        guard request.path.hasPrefix("/3/device/") else { return (404, .badPath, nil) }
        guard !token.isEmpty else { return (400, .missingDeviceToken, nil) }
        if (try? APNsNotification.validateDeviceToken(token)) == nil { return (400, .badDeviceToken, nil) }
        if let failure = checkProviderToken(request) { return (403, failure, nil) }
        guard let topic = request.header("apns-topic"), !topic.isEmpty else { return (400, .missingTopic, nil) }
        let pushType = request.header("apns-push-type").map { APNsPushType(rawValue: $0) } ?? .alert
        guard let pushType else { return (400, .invalidPushType, nil) }
        if !pushType.topicSuffix.isEmpty && !topic.hasSuffix(pushType.topicSuffix) { return (400, .badTopic, nil) }
        if let priorityText = request.header("apns-priority") {
            guard let priority = Int(priorityText).flatMap(APNsPriority.init(rawValue:)) else {
                return (400, .badPriority, nil)
            }
            if pushType == .background && priority == .immediately { return (400, .badPriority, nil) }
        }
        if let id = request.header("apns-id"), !APNsNotification.isCanonicalUUID(id) { return (400, .badMessageId, nil) }
        if let collapse = request.header("apns-collapse-id"), collapse.utf8.count > 64 { return (400, .badCollapseId, nil) }
        if let expiration = request.header("apns-expiration"), Int64(expiration) == nil {
            return (400, .badExpirationDate, nil)
        }
        guard !request.body.isEmpty else { return (400, .payloadEmpty, nil) }
        if request.body.count > pushType.maximumPayloadSize { return (413, .payloadTooLarge, nil) }
        if let died = state.withLock({ $0.unregistered[token] }) { return (410, .unregistered, died) }
        return (200, nil, nil)
    }

    /// With trusted keys configured: a bearer JWT signed ES256 by a known key for its team, not older than an hour.
    private func checkProviderToken(_ request: HTTP2ServerRequest) -> APNsReason? {
        guard !configuration.trustedKeys.isEmpty else { return nil }
        guard let authorization = request.header("authorization"), authorization.hasPrefix("bearer ") else {
            return .missingProviderToken
        }
        let parts = authorization.dropFirst("bearer ".count).split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3,
              let headerBytes = APNsTokenProvider.base64URLDecode(parts[0]),
              let claimsBytes = APNsTokenProvider.base64URLDecode(parts[1]),
              let signature = APNsTokenProvider.base64URLDecode(parts[2]),
              let header = try? JSONSerialization.jsonObject(with: Data(headerBytes)) as? [String: Any],
              let claims = try? JSONSerialization.jsonObject(with: Data(claimsBytes)) as? [String: Any],
              header["alg"] as? String == "ES256",
              let keyID = header["kid"] as? String, let issuer = claims["iss"] as? String,
              let issuedAt = (claims["iat"] as? NSNumber)?.int64Value else { return .invalidProviderToken }
        guard let trusted = configuration.trustedKeys[keyID], trusted.teamID == issuer,
              trusted.key.verify(signature, of: Array((parts[0] + "." + parts[1]).utf8)) else {
            return .invalidProviderToken
        }
        if Date().timeIntervalSince1970 - Double(issuedAt) > 3600 { return .expiredProviderToken }
        return nil
    }

    private func handleControl(_ request: HTTP2ServerRequest, _ writer: HTTP2ResponseWriter) {
        switch (request.method, request.path) {
        case ("GET", "/sim/stats"):
            let counts = countsByStatus()
            let total = counts.values.reduce(0, +)
            let byStatus = counts.keys.sorted().map { "\"\($0)\":\(counts[$0]!)" }.joined(separator: ",")
            writer.respond(status: 200, headers: [HTTP2Field(name: "content-type", value: "application/json")],
                           body: Array("{\"received\":\(total),\"by_status\":{\(byStatus)}}\n".utf8))
        default:
            writer.respond(status: 404, body: Array("{\"reason\":\"BadPath\"}".utf8))
        }
    }
}
