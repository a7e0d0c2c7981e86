/// Apple's rules for one push, in one place: the worker checks a job against them before it is accepted
/// (`PushJob.decode`) and the client checks each notification before it is sent (`APNsNotification.validate`).
/// `field` names the value for whoever reads the error: the job's member ("collapse_id") or the header.
public enum APNsRules {
    /// The largest `apns-collapse-id`, in bytes.
    public static let collapseIDLimit = 64

    public static func checkPayloadSize(_ size: Int, for pushType: APNsPushType) throws(APNsRequestError) {
        if size > pushType.maximumPayloadSize {
            throw .payloadTooLarge(size: size, limit: pushType.maximumPayloadSize, pushType: pushType)
        }
    }

    /// Background pushes wake an app in the background: Apple refuses them at priority 10.
    public static func checkPriority(_ priority: APNsPriority, for pushType: APNsPushType) throws(APNsRequestError) {
        if pushType == .background && priority == .immediately { throw .backgroundWithImmediatePriority }
        // Apple: a Live Activity push goes at 10 (counted against the activity's budget) or 5.
        if pushType == .liveactivity && priority == .lowest { throw .liveActivityLowestPriority }
    }

    public static func checkCollapseID(_ collapseID: String, field: String) throws(APNsRequestError) {
        if collapseID.utf8.count > collapseIDLimit { throw .collapseIDTooLong(collapseID.utf8.count) }
        if let problem = HeaderValue.problem(collapseID, allowsInnerSpaces: true) {
            throw .badHeaderValue(field, problem)
        }
    }

    /// The year 5138 in UNIX seconds: a larger time in seconds (an expiration, a deadline, a send_at) is almost
    /// certainly milliseconds.
    public static let latestSeconds: Int64 = 99_999_999_999
    /// `latestSeconds` as errors state it.
    public static let latestSecondsText = "\(latestSeconds) (the year 5138)"

    /// UNIX seconds; 0 means "once, do not store". Beyond `latestSeconds` it is milliseconds: refused rather than
    /// kept by APNs for the longest it keeps anything.
    public static func checkExpiration(_ expiration: Int64) throws(APNsRequestError) {
        if expiration < 0 || expiration > latestSeconds { throw .badExpiration(expiration) }
    }

    /// A topic as Apple defines a bundle ID: dot-separated parts of ASCII letters, digits and `-` (a push type's
    /// suffix, `.voip` or `.push-type.liveactivity`, is made of the same), at most 255 bytes. A broadcast's path is
    /// built from it: `/`, `?`, `#`, `%` or an empty part (`..`) would change the request.
    public static func checkTopic(_ topic: String, field: String) throws(APNsRequestError) {
        if topic.isEmpty { throw .missingTopic }
        guard let problem = topicProblem(topic) else { return }
        throw .badTopic(field, problem)
    }

    /// What keeps `topic` from being a bundle ID, or nil.
    public static func topicProblem(_ topic: some StringProtocol) -> String? {
        let bytes = topic.utf8
        if bytes.count > 255 { return "is \(bytes.count) bytes, over 255" }
        if bytes.isEmpty { return nil }
        // One pass over the bytes (every job's topic is checked): a "." first, after another, or last is an empty part.
        let dot = UInt8(ascii: ".")
        var previous = dot
        var emptyPart = false
        for byte in bytes {
            guard isBundleByte(byte) else {
                return byte < 0x80 && byte >= 0x20 && byte != 0x7F
                    ? "holds \"\(Character(Unicode.Scalar(byte)))\": a bundle ID is ASCII letters, digits, \"-\" and \".\""
                    : "holds a byte that is not an ASCII letter, digit, \"-\" or \".\""
            }
            if byte == dot && previous == dot { emptyPart = true }
            previous = byte
        }
        if emptyPart || previous == dot { return "has an empty part (a leading, trailing or double \".\")" }
        return nil
    }

    private static func isBundleByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"),
            UInt8(ascii: "-"), UInt8(ascii: "."):
            true
        default: false
        }
    }

    /// The topic ends with the suffix the push type requires (`.voip`, `.push-type.liveactivity`, ...).
    public static func checkTopicSuffix(_ topic: String, for pushType: APNsPushType) throws(APNsRequestError) {
        if !pushType.topicSuffix.isEmpty && !topic.hasSuffix(pushType.topicSuffix) {
            throw .topicMissingSuffix(topic: topic, pushType: pushType)
        }
    }
}
