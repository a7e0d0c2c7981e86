import APNs
import Foundation
import HTTP2
import JSON
import Synchronization
import Telemetry
import Threads

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
        var latencies = LatencyHistogram()
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
    /// (apns-bench stamps them at publish time), in microseconds: read under the lock, so that a poll leaves no copy
    /// of the buckets for the next push to pay for.
    func latencySummary() -> (count: Int, p50: UInt32, p99: UInt32, maximum: UInt32) {
        state.withLock { state in
            (
                state.latencies.count, state.latencies.percentile(0.5), state.latencies.percentile(0.99),
                state.latencies.maximum
            )
        }
    }
    func resetLatencies() { state.withLock { $0.latencies.reset() } }

    /// The `sent_at_us` stamp in a payload, if any: a byte search, not a JSON parse (this runs per notification).
    private static let sentAtMarker: StaticString = "\"sent_at_us\":"

    static func sentAtStamp(_ payload: [UInt8]) -> Int64? {
        let marker = UnsafeRawBufferPointer(start: sentAtMarker.utf8Start, count: sentAtMarker.utf8CodeUnitCount)
        return payload.withUnsafeBytes { bytes -> Int64? in
            guard bytes.count > marker.count else { return nil }
            var start: Int?
            // A quote, then the marker's second byte, then the whole marker: most bytes fail the first test, most
            // quotes the second.
            for index in 0..<(bytes.count - marker.count)
            where bytes[index] == marker[0] && bytes[index + 1] == marker[1]
                && memcmp(bytes.baseAddress! + index, marker.baseAddress!, marker.count) == 0
            {
                start = index + marker.count
                break
            }
            guard let start else { return nil }
            var value: Int64 = 0
            var position = start
            while position < bytes.count, bytes[position] >= 48, bytes[position] <= 57 {
                // More digits than microseconds since the epoch have is no stamp (and wrapped round, it made the
                // latency's subtraction trap).
                guard value < 100_000_000_000_000_000 else { return nil }
                value = value * 10 + Int64(bytes[position] - 48)
                position += 1
            }
            return position > start ? value : nil
        }
    }

    /// The path of a device push, and the token it names: compared and cut as UTF-8 bytes in place, not as characters
    /// (the simulator reads every push's path).
    private static let devicePath: StaticString = "/3/device/"

    static func isDevicePath(_ path: String) -> Bool {
        var path = path
        return path.withUTF8(hasDevicePrefix)
    }

    /// The token after the prefix; "" for a path without it.
    static func deviceToken(inPath path: String) -> String {
        var path = path
        return path.withUTF8 { bytes in
            guard hasDevicePrefix(bytes) else { return "" }
            return String(
                decoding: UnsafeBufferPointer(rebasing: bytes[devicePath.utf8CodeUnitCount...]), as: UTF8.self)
        }
    }

    private static func hasDevicePrefix(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        bytes.count >= devicePath.utf8CodeUnitCount
            && memcmp(bytes.baseAddress!, devicePath.utf8Start, devicePath.utf8CodeUnitCount) == 0
    }

    func handle(_ request: HTTP2ServerRequest, _ writer: HTTP2ResponseWriter) {
        let headers = PushHeaders(request)
        let route = Self.route(headers.path)
        switch route {
        case .control:
            handleControl(request, writer)
            return
        case .channels, .broadcast:
            handleBroadcastAPI(request, headers, writer, route: route)
            return
        case .device, .unknown:
            handleDevicePush(request, headers, writer)  // a path of no API is judged like a push: 404 BadPath
        }
    }

    /// A device push (`/3/device/<token>`), through the scripted faults, Apple's checks and the scripted answers.
    private func handleDevicePush(
        _ request: HTTP2ServerRequest, _ headers: PushHeaders, _ writer: HTTP2ResponseWriter
    ) {
        let token = Self.deviceToken(inPath: headers.path)
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
        var (status, reason, timestamp) = judge(
            request, headers, token: token, behaviour, certificate: certificate)
        if status == 200 { (status, reason) = scripted(token, behaviour) }
        let stamp = Self.sentAtStamp(request.body)
        let delay =
            behaviour.latency
            + (behaviour.latencyJitter > 0
                ? behaviour.latencyJitter * state.withLock { Double($0.random.nextFraction()) } : 0)
        let answeredAt = stamp == nil ? 0 : Int64(Date().timeIntervalSince1970 * 1e6) + Int64(delay * 1e6)
        let (apnsID, uniqueID, streamLimit, notification) = state.withLock { state in
            Self.note(
                request, headers, token: token, status: status, reason: reason, certificate: certificate, stamp: stamp,
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
        _ request: HTTP2ServerRequest, _ headers: PushHeaders, token: String, status: Int, reason: APNsReason?,
        certificate: String?, stamp: Int64?, answeredAt: Int64, behaviour: APNsSimulator.Behaviour,
        configuration: APNsSimulator.Configuration, in state: inout State
    )
        -> (String, String, UInt32?, ReceivedNotification?)
    {

        state.countsByStatus[status, default: 0] += 1
        if status == 200 && configuration.countsDistinctAccepted { state.acceptedTokens.insert(token) }
        let credential = certificate.map { "certificate:" + $0 } ?? state.connections[request.connectionID]?.credential
        if let credential { state.countsByCredential[credential, default: 0] += 1 }
        if let sentAt = stamp { state.latencies.record(UInt32(clamping: max(0, answeredAt - sentAt))) }
        let given = headers.id
        let apnsID = given.flatMap { AppleRules.isCanonicalUUID($0) ? $0 : nil } ?? state.ids.next()
        // Only development answers carry an apns-unique-id: production's go without making one.
        let uniqueID = configuration.isDevelopment ? state.ids.next() : ""
        var notification: ReceivedNotification?
        if configuration.recordsNotifications || configuration.observer != nil {
            notification = ReceivedNotification(
                deviceToken: token, topic: headers.topic, pushType: headers.pushType,
                priority: headers.priority, expiration: headers.expiration,
                collapseID: headers.collapseID, apnsID: apnsID, payload: request.body,
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
        if behaviour.expiredProviderTokenFor.contains(token) { return (403, .expiredProviderToken) }
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
        _ request: HTTP2ServerRequest, _ headers: PushHeaders, token: String, _ behaviour: APNsSimulator.Behaviour,
        certificate: String?
    ) -> (Int, APNsReason?, Int64?) {
        guard headers.method == "POST" else { return (405, .methodNotAllowed, nil) }
        guard Self.isDevicePath(headers.path) else { return (404, .badPath, nil) }
        guard !token.isEmpty else { return (400, .missingDeviceToken, nil) }
        if !AppleRules.isDeviceToken(token) { return (400, .badDeviceToken, nil) }
        let playedEnvironment = configuration.isDevelopment ? "sandbox" : "production"
        if let environment = behaviour.tokenEnvironments.first(where: { $0.covers(token) })?.value,
            environment != playedEnvironment
        {
            return (400, .badDeviceToken, nil)
        }
        if certificate == nil,
            let failure = checkProviderToken(headers.authorization, onConnection: request.connectionID)
        {
            return (failure == .tooManyProviderTokenUpdates ? 429 : 403, failure, nil)
        }
        guard let topic = headers.topic, !topic.isEmpty else { return (400, .missingTopic, nil) }
        // A certificate serves its app's topics: Apple's common name is "Apple Push Services: <bundle ID>".
        if let certificate {
            let prefix = "Apple Push Services: "
            let bundle = certificate.hasPrefix(prefix) ? String(certificate.dropFirst(prefix.count)) : certificate
            if bundle.contains("."), APNsPushType.bundle(ofTopic: topic) != bundle {
                return (400, .topicDisallowed, nil)
            }
        }
        let pushType = headers.pushType ?? "alert"
        guard let suffix = AppleRules.topicSuffixes[pushType] else { return (400, .invalidPushType, nil) }
        if !topic.hasSuffix(suffix) { return (400, .badTopic, nil) }
        if let tokenTopic = behaviour.tokenTopics.first(where: { $0.covers(token) })?.value, tokenTopic != topic {
            return (400, .deviceTokenNotForTopic, nil)
        }
        if let priority = headers.priority {
            guard AppleRules.priorities.contains(priority) else { return (400, .badPriority, nil) }
            if pushType == "background" && priority == "10" { return (400, .badPriority, nil) }
        }
        if let id = headers.id, !AppleRules.isCanonicalUUID(id) { return (400, .badMessageId, nil) }
        if let collapse = headers.collapseID, collapse.utf8.count > AppleRules.collapseIDLimit {
            return (400, .badCollapseId, nil)
        }
        if let expiration = headers.expiration, Int64(expiration) == nil {
            return (400, .badExpirationDate, nil)
        }
        guard !request.body.isEmpty else { return (400, .payloadEmpty, nil) }
        if request.body.count > AppleRules.payloadLimit(pushType: pushType) { return (413, .payloadTooLarge, nil) }
        // Apple documents no reason for a body that is not a JSON object; APNs refuses it, so the simulator does too.
        guard case .object? = try? JSONReader.check(request.body, allowsDuplicateKeys: true) else {
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
    func checkProviderToken(_ authorization: String?, onConnection connectionID: Int) -> APNsReason? {
        guard !configuration.trustedKeys.isEmpty else { return nil }
        guard let authorization, authorization.hasPrefix("bearer ") else {
            return .missingProviderToken
        }
        let now = Date().timeIntervalSince1970
        let (known, expired) = state.withLock { state in
            let connection = state.connections[connectionID]
            return (connection?.authorization, connection?.issuedAt.map(state.expiredIssuedAt.contains) ?? false)
        }
        // Verified on this connection already.
        if known == authorization { return expired ? .expiredProviderToken : nil }
        let (team, keyID, issuedAt, failure) = verifyProviderToken(authorization, now: now)
        if let failure { return failure }
        return state.withLock { state -> APNsReason? in
            if let issuedAt, state.expiredIssuedAt.contains(issuedAt) { return .expiredProviderToken }
            var connection = state.connections[connectionID, default: ConnectionState()]
            defer { state.connections[connectionID] = connection }
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
            let latency = latencySummary()
            let latencyText =
                "{\"count\":\(latency.count),\"p50\":\(latency.p50),\"p99\":\(latency.p99),\"max\":\(latency.maximum)}"
            let distinct =
                configuration.countsDistinctAccepted
                ? ",\"accepted_distinct\":\(state.withLock { $0.acceptedTokens.count })" : ""
            writer.respond(
                status: 200, headers: [HTTP2Field(name: "content-type", value: "application/json")],
                body: Array(
                    ("{\"received\":\(total),\"by_status\":{\(byStatus)},\"by_credential\":{\(byCredential)},\"broadcasts\":{\(byChannel)},"
                        + "\"latency_us\":\(latencyText)\(distinct)}\n").utf8))
        case ("POST", _) where request.path.hasPrefix("/sim/outage?seconds="):
            // Up to a day: "inf" is a number to Double, and an outage without end could only be ended by hand.
            guard let seconds = Double(request.path.dropFirst("/sim/outage?seconds=".count)),
                (0...86_400).contains(seconds)
            else {
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
