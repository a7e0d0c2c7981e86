import APNs
import Foundation
import HTTP2
import JSON
import Telemetry

/// Apple's two broadcast APIs (iOS 18), as apns-sim plays them, beside device pushes: channel management
/// (`/1/apps/<bundle ID>/channels`, `/1/apps/<bundle ID>/all-channels`; Apple serves it on
/// api-manage-broadcast.push.apple.com) and broadcast pushes (`POST /4/broadcasts/apps/<bundle ID>` with
/// `apns-channel-id`). Apple: "Sending channel management requests to APNs", "Sending broadcast push notification
/// requests to APNs". One simulator plays one environment, so its channels are that environment's.
struct BroadcastChannels {
    struct Channel {
        var bundle: String
        /// 1: Most Recent Message Stored; 0: No Message Stored (then a broadcast's apns-expiration must be 0).
        var storagePolicy: Int
    }

    /// Apple: up to 10,000 channels per environment.
    static let limit = 10_000

    var channels: [String: Channel] = [:]
    /// Broadcasts per channel, kept after a channel is deleted (for `/sim/stats`).
    var broadcastsByChannel: [String: Int] = [:]
    /// Broadcasts answered 429 so far (`Behaviour.throttleFirstBroadcasts`).
    var throttled = 0
}

/// What the router gives each API: the answer, or nil when the request is not theirs.
struct SimulatedAnswer: Error {
    var status: Int
    var reason: APNsReason?
    var headers: [HTTP2Field] = []
    var body: [UInt8] = []

    init(_ status: Int, _ reason: APNsReason? = nil, headers: [HTTP2Field] = [], body: [UInt8] = []) {
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body
    }
}

extension SimulatorCore {
    /// Which API a path belongs to.
    enum Route {
        case device
        case channels(bundle: String, all: Bool)
        case broadcast(bundle: String)
        case control
        case unknown
    }

    static func route(_ path: String) -> Route {
        if SimulatorCore.isDevicePath(path) { return .device }  // first: nearly every request is a push
        if path.hasPrefix("/sim/") { return .control }
        let parts = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        // "", "1", "apps", bundle, "channels" | "all-channels"
        if parts.count == 5, parts[1] == "1", parts[2] == "apps", !parts[3].isEmpty,
            parts[4] == "channels" || parts[4] == "all-channels"
        {
            return .channels(bundle: parts[3], all: parts[4] == "all-channels")
        }
        // "", "4", "broadcasts", "apps", bundle
        if parts.count == 5, parts[1] == "4", parts[2] == "broadcasts", parts[3] == "apps", !parts[4].isEmpty {
            return .broadcast(bundle: parts[4])
        }
        return .unknown
    }

    /// Answers a channel management or broadcast request, after the same provider-token or certificate checks as
    /// a device push; `apns-request-id` is echoed (or made), as Apple does.
    func handleBroadcastAPI(
        _ request: HTTP2ServerRequest, _ headers: PushHeaders, _ writer: HTTP2ResponseWriter, route: Route
    ) {
        let certificate =
            configuration.clientCertificateCA == nil ? nil : writer.serverConnection.peerCertificateCommonName
        var answer: SimulatedAnswer
        if certificate == nil,
            let failure = checkProviderToken(headers.authorization, onConnection: request.connectionID)
        {
            answer = SimulatedAnswer(failure == .tooManyProviderTokenUpdates ? 429 : 403, failure)
        } else {
            switch route {
            case .channels(let bundle, let all): answer = manageChannels(request, bundle: bundle, all: all)
            case .broadcast(let bundle): answer = broadcast(request, bundle: bundle)
            default: answer = SimulatedAnswer(404, .badPath)
            }
        }
        let requestID =
            request.header("apns-request-id").flatMap { AppleRules.isCanonicalUUID($0) ? $0 : nil }
            ?? state.withLock { $0.ids.next() }
        var headers = [HTTP2Field(name: "apns-request-id", value: requestID)] + answer.headers
        var body = answer.body
        if let reason = answer.reason {
            headers.append(HTTP2Field(name: "content-type", value: "application/json"))
            body = Array("{\"reason\":\(JSONString.quote(reason.rawValue))}".utf8)
        }
        state.withLock { $0.countsByStatus[answer.status, default: 0] += 1 }
        writer.respond(status: answer.status, headers: headers, body: body)
    }

    private func manageChannels(_ request: HTTP2ServerRequest, bundle: String, all: Bool) -> SimulatedAnswer {
        if all {
            guard request.method == "GET" else { return SimulatedAnswer(405, .methodNotAllowed) }
            let ids = state.withLock { state in
                state.broadcast.channels.filter { $0.value.bundle == bundle }.keys.sorted()
            }
            let list = ids.map { JSONString.quote($0) }.joined(separator: ",")
            return SimulatedAnswer(
                200, headers: [HTTP2Field(name: "content-type", value: "application/json")],
                body: Array("{\"channels\":[\(list)]}".utf8))
        }
        switch request.method {
        case "POST":
            guard let document = try? JSONReader.parse(request.body),
                case .number(let policyText)? = document["message-storage-policy"],
                let policy = Int(policyText), policy == 0 || policy == 1
            else {
                return SimulatedAnswer(400, .badRequestParams)
            }
            guard case .string(let pushType)? = document["push-type"] else {
                return SimulatedAnswer(400, .missingPushType)
            }
            guard pushType.lowercased() == "liveactivity" else { return SimulatedAnswer(400, .invalidPushType) }
            let created: String? = state.withLock { state in
                guard state.broadcast.channels.count < BroadcastChannels.limit else { return nil }
                let id = Self.channelID(state.ids.next())
                state.broadcast.channels[id] = BroadcastChannels.Channel(bundle: bundle, storagePolicy: policy)
                return id
            }
            guard let created else { return SimulatedAnswer(400, .cannotCreateChannelConfig) }
            return SimulatedAnswer(201, headers: [HTTP2Field(name: "apns-channel-id", value: created)])
        case "GET", "DELETE":
            let id: String
            do { id = try channel(request, bundle: bundle) } catch { return error }
            if request.method == "DELETE" {
                state.withLock { _ = $0.broadcast.channels.removeValue(forKey: id) }
                return SimulatedAnswer(204)
            }
            let policy = state.withLock { $0.broadcast.channels[id]?.storagePolicy ?? 0 }
            return SimulatedAnswer(
                200, headers: [HTTP2Field(name: "content-type", value: "application/json")],
                body: Array("{\"message-storage-policy\":\(policy),\"push-type\":\"LiveActivity\"}".utf8))
        default:
            return SimulatedAnswer(405, .methodNotAllowed)
        }
    }

    /// The channel a request names in `apns-channel-id`, if it is one of `bundle`'s; else the answer that says not.
    private func channel(_ request: HTTP2ServerRequest, bundle: String) throws(SimulatedAnswer) -> String {
        guard let id = request.header("apns-channel-id"), !id.isEmpty else {
            throw SimulatedAnswer(400, .missingChannelId)
        }
        guard id.utf8.count <= 256, Data(base64Encoded: id) != nil else { throw SimulatedAnswer(400, .badChannelId) }
        // Apple documents no reason for another app's channel: it is not registered for this one.
        guard state.withLock({ $0.broadcast.channels[id]?.bundle }) == bundle else {
            throw SimulatedAnswer(400, .channelNotRegistered)
        }
        return id
    }

    private func broadcast(_ request: HTTP2ServerRequest, bundle: String) -> SimulatedAnswer {
        guard request.method == "POST" else { return SimulatedAnswer(405, .methodNotAllowed) }
        let id: String
        do { id = try channel(request, bundle: bundle) } catch { return error }
        guard let pushType = request.header("apns-push-type") else { return SimulatedAnswer(400, .missingPushType) }
        guard pushType.lowercased() == "liveactivity" else { return SimulatedAnswer(400, .invalidPushType) }
        // Required on a broadcast, unlike a device push.
        guard let priority = request.header("apns-priority"), AppleRules.priorities.contains(priority) else {
            return SimulatedAnswer(400, .badPriority)
        }
        guard let expirationText = request.header("apns-expiration"), let expiration = Int64(expirationText) else {
            return SimulatedAnswer(400, .badExpirationDate)
        }
        let storagePolicy = state.withLock { $0.broadcast.channels[id]?.storagePolicy ?? 0 }
        if storagePolicy == 0 && expiration != 0 { return SimulatedAnswer(400, .badExpirationDate) }
        guard !request.body.isEmpty else { return SimulatedAnswer(400, .payloadEmpty) }
        if request.body.count > 5120 { return SimulatedAnswer(413, .payloadTooLarge) }
        guard Self.isLiveActivityPayload(request.body, broadcast: true) else {
            return SimulatedAnswer(400, .badRequestPayload)
        }
        let throttled = state.withLock { state in
            guard state.broadcast.throttled < state.behaviour.throttleFirstBroadcasts else { return false }
            state.broadcast.throttled += 1
            return true
        }
        if throttled { return SimulatedAnswer(429, .tooManyRequests) }
        if state.withLock({ $0.behaviour.broadcastsGone }) { return SimulatedAnswer(410, .unregistered) }
        let uniqueID = state.withLock { state in
            state.broadcast.broadcastsByChannel[id, default: 0] += 1
            return state.ids.next()
        }
        configuration.broadcastObserver?(id)
        return SimulatedAnswer(200, headers: [HTTP2Field(name: "apns-unique-id", value: uniqueID)])
    }

    /// A Live Activity payload as ActivityKit reads it: `aps` with an `event` (start, update, end; a broadcast
    /// cannot start an activity), a whole-number `timestamp`, and `content-state`.
    static func isLiveActivityPayload(_ body: [UInt8], broadcast: Bool) -> Bool {
        guard let document = try? JSONReader.parse(body, allowsDuplicateKeys: true), let aps = document["aps"],
            case .string(let event)? = aps["event"], ["start", "update", "end"].contains(event),
            case .number(let timestamp)? = aps["timestamp"], Int64(timestamp) != nil
        else { return false }
        if broadcast && event == "start" { return false }
        // Every event carries a content state (an end its final one).
        guard case .object? = aps["content-state"] else { return false }
        return true
    }

    /// A channel id as Apple's look: base64 of 16 random bytes.
    static func channelID(_ uuid: String) -> String {
        let hex = uuid.replacingOccurrences(of: "-", with: "")
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            bytes.append(UInt8(hex[index..<next], radix: 16) ?? 0)
            index = next
        }
        return Data(bytes).base64EncodedString()
    }
}
