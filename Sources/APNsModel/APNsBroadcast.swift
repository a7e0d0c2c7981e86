import Foundation

/// A broadcast push (iOS 18): one request, `POST /4/broadcasts/apps/<bundle ID>` with `apns-channel-id`, that APNs
/// fans out to every device subscribed to the channel (Apple: "Sending broadcast push notification requests to
/// APNs"). Always a Live Activity update or end: a broadcast cannot start an activity.
public struct APNsBroadcast: Sendable, Equatable {
    public var bundle: String
    public var channelID: String
    public var priority: APNsPriority
    /// UNIX seconds APNs keeps the message for devices that are offline; 0 (the default) delivers once. A channel
    /// that stores no message takes 0 only.
    public var expiration: Int64
    public var payload: [UInt8]
    /// UNIX seconds: not sent once this time has come (a job's `deadline`); nil for none. Not a field of the request.
    public var sendBy: Int64?

    /// Apple: a broadcast payload is at most 5 KB.
    public static let maximumPayloadSize = 5120

    public init(
        bundle: String, channelID: String, priority: APNsPriority = .immediately, expiration: Int64 = 0,
        payload: [UInt8], sendBy: Int64? = nil
    ) {
        self.bundle = bundle
        self.channelID = channelID
        self.priority = priority
        self.expiration = expiration
        self.payload = payload
        self.sendBy = sendBy
    }

    /// Apple's rules that can be checked before sending.
    public func validate() throws(APNsRequestError) {
        try APNsRules.checkTopic(bundle, field: "\"topic\"")
        try APNsChannelID.check(channelID)
        guard !payload.isEmpty else { throw .payloadEmpty }
        guard payload.count <= Self.maximumPayloadSize else {
            throw .payloadTooLarge(size: payload.count, limit: Self.maximumPayloadSize, pushType: .liveactivity)
        }
    }
}

/// A channel id as Apple issues them: base64, of a size nobody should assume.
public enum APNsChannelID {
    public static func check(_ id: String) throws(APNsRequestError) {
        guard !id.isEmpty, id.utf8.count <= 256, Data(base64Encoded: id) != nil else { throw .badChannelID(id) }
    }
}
