import APNsModel

/// Weighs one job's 400 BadDeviceToken and DeviceTokenNotForTopic answers before any token is removed for them.
///
/// A 410 with its timestamp is Apple's word about one token. A 400 mismatch says only that the token and the request
/// do not match, and a wave of them in one job is far more often a configuration mistake (a sibling app's topic,
/// a production job sent to the sandbox endpoint) than a wave of dead tokens: acting on it would wipe the cache of
/// every user the job targets. So when at least `threshold` of a job's answers are mismatches and they are more than
/// half of its answers, none of them removes a token or becomes a dead-token event. 410s are never held back.
public struct MassInvalidationGuard: Sendable, Equatable {
    /// WORKER_MASS_INVALIDATION_THRESHOLD (default 20).
    public var threshold: Int

    public init(threshold: Int) {
        self.threshold = threshold
    }

    public func holdsBack(mismatches: Int, answers: Int) -> Bool {
        mismatches >= threshold && mismatches * 2 > answers
    }
}
