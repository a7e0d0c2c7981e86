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
        if let problem = HeaderValue.problem(collapseID, allowsInnerSpaces: true) { throw .badHeaderValue(field, problem) }
    }

    /// UNIX seconds; 0 means "once, do not store".
    public static func checkExpiration(_ expiration: Int64) throws(APNsRequestError) {
        if expiration < 0 { throw .badExpiration(expiration) }
    }

    /// A topic that can be sent as `apns-topic` (no whitespace, no control character).
    public static func checkTopic(_ topic: String, field: String) throws(APNsRequestError) {
        if topic.isEmpty { throw .missingTopic }
        if let problem = HeaderValue.problem(topic, allowsInnerSpaces: false) { throw .badHeaderValue(field, problem) }
    }

    /// The topic ends with the suffix the push type requires (`.voip`, `.push-type.liveactivity`, ...).
    public static func checkTopicSuffix(_ topic: String, for pushType: APNsPushType) throws(APNsRequestError) {
        if !pushType.topicSuffix.isEmpty && !topic.hasSuffix(pushType.topicSuffix) {
            throw .topicMissingSuffix(topic: topic, pushType: pushType)
        }
    }
}
