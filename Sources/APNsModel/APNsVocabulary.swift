/// Apple's vocabulary for a push. Push types and priorities are closed sets (a job naming another is refused), kept
/// as enums: copied and compared as one byte on the per-notification path, where structs of strings each cost a few
/// reference counts and string comparisons. Reasons stay an open set.

/// The `apns-push-type` header, with the topic suffix Apple requires for it.
public enum APNsPushType: String, Hashable, Sendable, CaseIterable, CustomStringConvertible {
    case alert, background, voip, complication, fileprovider, mdm, liveactivity, location, pushtotalk, widgets, controls

    /// What `apns-topic` must end with for this push type ("" when the bundle ID is used as it is).
    public var topicSuffix: String {
        switch self {
        case .alert, .background, .mdm: ""
        case .voip: ".voip"
        case .complication: ".complication"
        case .fileprovider: ".pushkit.fileprovider"
        case .liveactivity: ".push-type.liveactivity"
        case .location: ".location-query"
        case .pushtotalk: ".voip-ptt"
        case .widgets: ".push-type.widgets"
        case .controls: ".push-type.controls"
        }
    }

    /// Largest payload Apple accepts for this push type.
    public var maximumPayloadSize: Int { self == .voip ? 5120 : 4096 }

    /// The priority Apple expects when a job names none.
    public var defaultPriority: APNsPriority { self == .background ? .considerPower : .immediately }

    /// The topic to send with: the bundle ID plus the suffix this push type needs, unless it is already there.
    public func topic(forBundle bundle: String) -> String {
        topicSuffix.isEmpty || bundle.hasSuffix(topicSuffix) ? bundle : bundle + topicSuffix
    }

    /// The bundle ID a topic is for: the topic without the suffix of the push type that needs one.
    public static func bundle(ofTopic topic: String) -> String {
        for type in allCases where !type.topicSuffix.isEmpty && topic.hasSuffix(type.topicSuffix) {
            return String(topic.dropLast(type.topicSuffix.count))
        }
        return topic
    }

    /// Whether a topic ends with one of the suffixes Apple gives push types with tokens of their own (`.voip`,
    /// `.push-type.liveactivity`, ...): such a topic is never served by an app's ordinary device token.
    public static func hasTokenKindSuffix(_ topic: String) -> Bool {
        allCases.contains { !$0.topicSuffix.isEmpty && topic.hasSuffix($0.topicSuffix) }
    }

    public var description: String { rawValue }
}

/// The `apns-priority` header. 10 is immediate, 5 is power-aware (the source article has them reversed), 1 is lowest.
public enum APNsPriority: Int, Hashable, Sendable, CustomStringConvertible {
    case immediately = 10
    case considerPower = 5
    case lowest = 1

    public var description: String { String(rawValue) }
}

/// Which APNs a device token belongs to.
public enum APNsEnvironment: String, Sendable, Hashable, CaseIterable {
    case production
    case sandbox
}

/// Apple's `reason` strings: an open set, so a reason Apple adds later is kept, not a decoding failure.
public struct APNsReason: Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String

    public init(_ rawValue: String) { self.rawValue = rawValue }

    public var description: String { rawValue }

    /// Apple's documented reasons: the only values a metric label or a summary key takes.
    public static let documented: Set<String> = [
        "BadCollapseId", "BadDeviceToken", "BadExpirationDate", "BadMessageId", "BadPriority", "BadTopic",
        "DeviceTokenNotForTopic", "DuplicateHeaders", "IdleTimeout", "InvalidPushType", "MissingDeviceToken",
        "MissingTopic", "PayloadEmpty", "TopicDisallowed", "BadCertificate", "BadCertificateEnvironment",
        "ExpiredProviderToken", "Forbidden", "InvalidProviderToken", "MissingProviderToken", "UnrelatedKeyIdInToken",
        "BadEnvironmentKeyIdInToken", "BadPath", "MethodNotAllowed", "Unregistered", "ExpiredToken", "PayloadTooLarge",
        "TooManyProviderTokenUpdates", "TooManyRequests", "InternalServerError", "ServiceUnavailable", "Shutdown",
        // Broadcast pushes and channel management (iOS 18).
        "FeatureNotEnabled", "MissingChannelId", "BadChannelId", "ChannelNotRegistered", "BadRequestParams",
        "BadRequestPayload", "MissingPushType", "CannotCreateChannelConfig", "TopicMismatch"
    ]

    // Broadcast pushes and channel management.
    public static let featureNotEnabled = APNsReason("FeatureNotEnabled")
    public static let missingChannelId = APNsReason("MissingChannelId")
    public static let badChannelId = APNsReason("BadChannelId")
    public static let channelNotRegistered = APNsReason("ChannelNotRegistered")
    public static let badRequestParams = APNsReason("BadRequestParams")
    public static let badRequestPayload = APNsReason("BadRequestPayload")
    public static let missingPushType = APNsReason("MissingPushType")
    public static let cannotCreateChannelConfig = APNsReason("CannotCreateChannelConfig")
    public static let topicMismatch = APNsReason("TopicMismatch")

    /// The reason as a metric label or a summary key: one of Apple's documented reasons, or `other`. Whatever an
    /// endpoint writes (it may echo the path, a token with it) never becomes a label: the set stays small and
    /// holds no personal data. The text itself goes to the log only, shortened and redacted.
    public var label: String { Self.documented.contains(rawValue) ? rawValue : "other" }

    // 400
    public static let badCollapseId = APNsReason("BadCollapseId")
    public static let badDeviceToken = APNsReason("BadDeviceToken")
    public static let badExpirationDate = APNsReason("BadExpirationDate")
    public static let badMessageId = APNsReason("BadMessageId")
    public static let badPriority = APNsReason("BadPriority")
    public static let badTopic = APNsReason("BadTopic")
    public static let deviceTokenNotForTopic = APNsReason("DeviceTokenNotForTopic")
    public static let duplicateHeaders = APNsReason("DuplicateHeaders")
    public static let idleTimeout = APNsReason("IdleTimeout")
    public static let invalidPushType = APNsReason("InvalidPushType")
    public static let missingDeviceToken = APNsReason("MissingDeviceToken")
    public static let missingTopic = APNsReason("MissingTopic")
    public static let payloadEmpty = APNsReason("PayloadEmpty")
    public static let topicDisallowed = APNsReason("TopicDisallowed")
    // 403
    public static let badCertificate = APNsReason("BadCertificate")
    public static let badCertificateEnvironment = APNsReason("BadCertificateEnvironment")
    public static let expiredProviderToken = APNsReason("ExpiredProviderToken")
    public static let forbidden = APNsReason("Forbidden")
    public static let invalidProviderToken = APNsReason("InvalidProviderToken")
    public static let missingProviderToken = APNsReason("MissingProviderToken")
    public static let unrelatedKeyIdInToken = APNsReason("UnrelatedKeyIdInToken")
    public static let badEnvironmentKeyIdInToken = APNsReason("BadEnvironmentKeyIdInToken")
    // 404, 405
    public static let badPath = APNsReason("BadPath")
    public static let methodNotAllowed = APNsReason("MethodNotAllowed")
    // 410
    public static let unregistered = APNsReason("Unregistered")
    public static let expiredToken = APNsReason("ExpiredToken")
    // 413
    public static let payloadTooLarge = APNsReason("PayloadTooLarge")
    // 429
    public static let tooManyProviderTokenUpdates = APNsReason("TooManyProviderTokenUpdates")
    public static let tooManyRequests = APNsReason("TooManyRequests")
    // 500, 503
    public static let internalServerError = APNsReason("InternalServerError")
    public static let serviceUnavailable = APNsReason("ServiceUnavailable")
    public static let shutdown = APNsReason("Shutdown")
}
