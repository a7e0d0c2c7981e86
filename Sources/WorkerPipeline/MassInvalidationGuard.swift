import APNsModel

/// Weighs 400 BadDeviceToken and DeviceTokenNotForTopic answers before any token is removed for them, in one job
/// and across the whole fleet.
///
/// A 410 with its timestamp is Apple's word about one token. A 400 mismatch says only that the token and the request
/// do not match, and a wave of them is far more often a configuration mistake (a sibling app's topic, a production
/// job sent to the sandbox endpoint, a cache written with the wrong environment) than a wave of dead tokens: acting
/// on it would wipe the cache of every user it reaches. So when at least `threshold` mismatches are more than
/// `share` of the answers that judge a token, in one job or in the fleet's recent answers (`InvalidationWindow`),
/// none of them removes a token or becomes a dead-token event. 410s are never held back. Only answers that judge a
/// token count: throttling, server errors and lost connections say nothing about tokens, and must not dilute a wave.
public struct MassInvalidationGuard: Sendable, Equatable {
    /// Mismatches that may trip the guard, at least.
    public var threshold: Int
    /// The share of token-judging answers that mismatches must exceed to trip it (0...1).
    public var share: Double

    public init(threshold: Int, share: Double = 0.1) {
        self.threshold = threshold
        self.share = share
    }

    /// 200, 410 and the 400 mismatches: the answers that say something about a token.
    public static func judgesToken(_ response: APNsResponse) -> Bool {
        response.status == 200 || response.status == 410 || APNsOutcome.isTokenMismatch(response)
    }

    public func holdsBack(_ counts: InvalidationCounts) -> Bool {
        counts.mismatches >= threshold && Double(counts.mismatches) > share * Double(counts.judged)
    }

    /// The fleet's answers hold mismatches back when those of the last minute do, or those of the last hour: a wave
    /// slower than the threshold a minute (a low-traffic fleet misconfigured) trips it within the hour.
    public func holdsBack(_ fleet: FleetInvalidationCounts) -> Bool {
        holdsBack(fleet.lastMinute) || holdsBack(fleet.lastHour)
    }

    /// Who held a job's mismatches back.
    public enum Verdict: Sendable, Equatable {
        /// They count as dead tokens: removed, with events.
        case remove
        /// The job's own answers look like a configuration mistake.
        case heldBackByJob
        /// The fleet's recent answers do (or could not be read: nothing is removed on a guess).
        case heldBackByFleet
    }

    /// A job's verdict from its own answers and the fleet window's totals (this job's answers included; nil when the
    /// window could not be read).
    public func verdict(job: InvalidationCounts, fleet: FleetInvalidationCounts?) -> Verdict {
        guard job.mismatches > 0 else { return .remove }
        if holdsBack(job) { return .heldBackByJob }
        guard let fleet else { return .heldBackByFleet }
        return holdsBack(fleet) ? .heldBackByFleet : .remove
    }
}

/// Answers that judge a token, and the 400 mismatches among them.
public struct InvalidationCounts: Sendable, Equatable {
    public var mismatches: Int
    public var judged: Int

    public init(mismatches: Int = 0, judged: Int = 0) {
        self.mismatches = mismatches
        self.judged = judged
    }

    public static func + (lhs: Self, rhs: Self) -> Self {
        InvalidationCounts(mismatches: lhs.mismatches + rhs.mismatches, judged: lhs.judged + rhs.judged)
    }
}

/// The fleet's token-judging answers over two spans (`InvalidationWindow`).
public struct FleetInvalidationCounts: Sendable, Equatable {
    public var lastMinute: InvalidationCounts
    public var lastHour: InvalidationCounts

    public init(lastMinute: InvalidationCounts, lastHour: InvalidationCounts) {
        self.lastMinute = lastMinute
        self.lastHour = lastHour
    }
}
