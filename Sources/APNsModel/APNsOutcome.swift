import Foundation
import JSON

/// An answer's header fields as the transport received them, read only when asked for (the HTTP/2 client's header
/// block conforms, and fits an existential's inline storage: no allocation per answer).
public protocol ReceivedHeaderFields: Sendable {
    func value(_ name: String) -> String?
}

/// What APNs answered for one notification.
public struct APNsResponse: Sendable, Equatable {
    public var status: Int
    /// The answer's apns-id. Read from the received fields when asked for: most answers are 200s nobody asks about,
    /// and they then cost no String.
    public var apnsID: String? {
        get { givenAPNsID ?? fields?.value("apns-id") }
        set { givenAPNsID = newValue }
    }
    /// Development environment only.
    public var apnsUniqueID: String? {
        get { givenUniqueID ?? fields?.value("apns-unique-id") }
        set { givenUniqueID = newValue }
    }
    // Optional fields spelled `Optional<T>` (CodeShapeTests.valuesMadePerJobSpellTheirOptionalsOut says why).
    public var reason: Optional<APNsReason>
    /// With 410: milliseconds since the epoch at which APNs learned the token is no longer valid for the topic.
    public var timestamp: Optional<Int64>
    /// The answer header fields an `APNsResponse` reads: a transport need keep no other.
    public static let headerNames = ["apns-id", "apns-unique-id"]
    /// Those kept of a successful answer for a caller that reads no delivered notification's apns-id
    /// (`APNsClientConfiguration.keepsDeliveredAPNsID`): broadcasts' and development answers' apns-unique-id.
    public static let successHeaderNamesWithoutAPNsID = ["apns-unique-id"]

    private var givenAPNsID: Optional<String>
    private var givenUniqueID: Optional<String>
    /// A constant, initialized once in each initializer: assigned after a delegated initializer had made it nil, the
    /// optional existential went through the runtime's generic move, for every answer.
    private let fields: (any ReceivedHeaderFields)?

    public init(
        status: Int, apnsID: String? = nil, apnsUniqueID: String? = nil, reason: APNsReason? = nil,
        timestamp: Int64? = nil
    ) {
        self.status = status
        self.givenAPNsID = apnsID
        self.givenUniqueID = apnsUniqueID
        self.reason = reason
        self.timestamp = timestamp
        fields = nil
    }

    public init(status: Int, fields: some ReceivedHeaderFields, reason: APNsReason?, timestamp: Int64?) {
        self.status = status
        givenAPNsID = nil
        givenUniqueID = nil
        self.reason = reason
        self.timestamp = timestamp
        self.fields = fields
    }

    public static func == (lhs: APNsResponse, rhs: APNsResponse) -> Bool {
        lhs.status == rhs.status && lhs.reason == rhs.reason && lhs.timestamp == rhs.timestamp
            && lhs.apnsID == rhs.apnsID && lhs.apnsUniqueID == rhs.apnsUniqueID
    }

    /// Reads `{"reason": "...", "timestamp": ...}`; a body that is not that JSON leaves both nil, never fails.
    /// The project's own strict reader: one JSON parser for everything that comes from outside, which keeps a
    /// number's text, so an absurd timestamp costs the timestamp, not the reason.
    public static func parseBody(_ body: [UInt8]) -> (reason: APNsReason?, timestamp: Int64?) {
        guard !body.isEmpty, body.count <= 64 * 1024,
            let document = try? JSONReader.parse(body, maximumDepth: 8, allowsDuplicateKeys: true),
            case .object = document
        else {
            return (nil, nil)
        }
        let reason: APNsReason? = if case .string(let text)? = document["reason"] { APNsReason(text) } else { nil }
        var timestamp: Int64?
        if case .number(let text)? = document["timestamp"] {
            timestamp = Int64(text) ?? Double(text).flatMap { Int64(exactly: $0.rounded()) }
        }
        return (reason, timestamp)
    }
}

/// The one place that decides what a response, or its absence, means. The pipeline switches over this, nothing else.
public enum APNsOutcome: Sendable, Equatable {
    /// Accepted by APNs.
    case delivered
    /// The token is dead for this topic: stop sending to it and tell the token owners.
    case deadToken
    /// Try again after `delay` seconds (throttling, server trouble, lost connections).
    case retryLater(delay: Double)
    /// The provider token expired: mint a new one, then send again.
    case refreshTokenAndRetry
    /// A new connection is needed (key or environment not bound to this one), then send again.
    case replaceConnectionAndRetry
    /// Sending again cannot help: the notification or the configuration is wrong.
    case permanentFailure
    /// Not sent: no credential serves the topic now (a reload took it away). The job waits for an operator, parked
    /// with the reason; it is not the notification's fault.
    case unserved
    /// Not sent: its send-by time (`APNsNotification.sendBy`, a job's deadline) came while it waited for a connection
    /// or a stream.
    case expired

    public static func classify(_ response: APNsResponse) -> APNsOutcome {
        switch response.status {
        case 200:
            return .delivered
        case 410:
            return .deadToken
        case 400 where isTokenMismatch(response):
            return .deadToken
        case 403 where response.reason == .expiredProviderToken:
            return .refreshTokenAndRetry
        case 403 where response.reason == .unrelatedKeyIdInToken || response.reason == .badEnvironmentKeyIdInToken:
            return .replaceConnectionAndRetry
        case 429 where response.reason == .tooManyProviderTokenUpdates:
            return .retryLater(delay: 5)
        case 429:
            return .retryLater(delay: 60)
        case 400 where response.reason == .idleTimeout:
            return .retryLater(delay: 0)
        case 500...599:
            return .retryLater(delay: 15)
        default:
            return .permanentFailure
        }
    }

    /// 400 BadDeviceToken or DeviceTokenNotForTopic: the token and the request do not match. That is a dead token
    /// only as often as it is a wrong topic or environment in the request (Apple gives no timestamp, unlike 410),
    /// so the pipeline weighs these answers before it removes anything (the mass-invalidation guard).
    public static func isTokenMismatch(_ response: APNsResponse) -> Bool {
        response.status == 400 && (response.reason == .badDeviceToken || response.reason == .deviceTokenNotForTopic)
    }

    /// A configuration mistake an operator must fix (keys, certificates, topics): logged loudly, never retried in a loop.
    public static func isConfigurationError(_ response: APNsResponse) -> Bool {
        guard response.status == 403 else { return response.reason == .topicDisallowed || response.reason == .badTopic }
        return response.reason != .expiredProviderToken
    }
}

/// One notification's fate, as the pipeline needs it.
public struct APNsResult: Sendable, Equatable {
    public let outcome: APNsOutcome
    /// APNs's answer, when there was one.
    public let response: APNsResponse?
    /// Why there was no answer (connection trouble), or why it was not sent (a broken rule).
    public let error: String?
    /// The answer's status, kept apart: read as `response?.status`, the whole answer (a few strings and its header
    /// fields) would be copied to read one number.
    public let status: Int?

    public init(outcome: APNsOutcome, response: APNsResponse? = nil, error: String? = nil) {
        self.outcome = outcome
        self.status = response?.status
        self.response = response
        self.error = error
    }

    /// The result of an answer, moved in: the optional `response` above was copied (through the standard library's
    /// generic copy of an optional) to read its status, for every answer.
    public init(outcome: APNsOutcome, answer: consuming APNsResponse) {
        self.outcome = outcome
        status = answer.status
        response = answer
        error = nil
    }

    /// Delivered with a 200: nearly every answer.
    public var isPlainDelivery: Bool { outcome == .delivered && status == 200 }
}
