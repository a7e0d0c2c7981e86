import JSON

/// When notifications APNs asked to retry are tried again, after how long, and when a job gives up on them.
///
/// A retry waits in a delay queue (the tier for its attempt, or a longer one if APNs suggested a longer wait), so
/// nothing is held in the worker. A job that would only come back after its deadline expires at once instead of
/// travelling; a job out of attempts is parked with its original body for people to look at.
public struct RetryPolicy: Sendable, Equatable {
    /// Attempts at a notification APNs asked to retry, the first one included.
    public var maximumAttempts: Int
    /// Seconds a retry waits, by attempt (the last repeats), shortest first.
    public private(set) var delays: [Double]

    /// `delays` empty means one second for every attempt (the configuration refuses an empty list anyway).
    public init(maximumAttempts: Int, delays: [Double]) {
        self.maximumAttempts = maximumAttempts
        self.delays = delays.isEmpty ? [1] : delays.sorted()
    }

    /// What becomes of a finished job's retryable notifications.
    public enum Decision: Sendable, Equatable {
        /// Nothing to retry.
        case none
        /// Another attempt after `delay` seconds.
        case retry(delay: Double)
        /// The retry would come after the job's deadline: the notifications expire now, unsent.
        case expire
        /// The last attempt is spent: the job is parked.
        case park
    }

    /// The delay for a retry: the tier for this attempt, or a longer tier if APNs asked for a longer wait.
    public func delay(attempt: Int, suggestedDelay: Double) -> Double {
        let byAttempt = min(max(attempt - 1, 0), delays.count - 1)
        let bySuggestion = delays.firstIndex { $0 >= suggestedDelay } ?? delays.count - 1
        return delays[max(byAttempt, bySuggestion)]
    }

    /// The decision for a job at `attempt` with `retryable` notifications, the longest delay APNs suggested for them,
    /// and its deadline (UNIX seconds), at `now` (UNIX seconds).
    public func decide(attempt: Int, retryable: Int, suggestedDelay: Double, deadline: Int64?, now: Double) -> Decision
    {
        guard retryable > 0 else { return .none }
        let delay = delay(attempt: attempt, suggestedDelay: suggestedDelay)
        if let deadline, now + delay >= Double(deadline) { return .expire }
        return attempt < maximumAttempts ? .retry(delay: delay) : .park
    }
}

extension PushJob {
    /// The job the worker schedules to send `targets` again: everything as before, the users already resolved, and
    /// the job as its sender enqueued it (`original`: the delivered body of a first attempt), to be parked unchanged
    /// if the last attempt fails too. The `retry` member is the worker's own; a job enqueued by a backend never
    /// carries it. The id goes in only if the job named it: otherwise it is the message-id, which the retry keeps, or
    /// was made of the delivery tag, which other jobs' deliveries repeat (unrelated retries shared an idempotency
    /// record and a settled name).
    public func retryBody(targets: [DeviceTarget], original: [UInt8]) -> [UInt8] {
        var text = idFromBody ? "{\"id\":\(JSONString.quote(id))," : "{"
        text += "\"topic\":\(JSONString.quote(topic)),"
        text += "\"push_type\":\"\(pushType.rawValue)\",\"priority\":\(priority.rawValue),"
        if let expiration { text += "\"expiration\":\(expiration)," }
        if let collapseID { text += "\"collapse_id\":\(JSONString.quote(collapseID))," }
        if let deadline { text += "\"deadline\":\(deadline)," }
        text += "\"retry\":{\"attempt\":\(attempt + 1),\"targets\":["
        text += targets.map { target in
            "{\"token\":\(JSONString.quote(target.token)),\"environment\":\"\(target.environment.rawValue)\","
                + "\"user\":\(target.user.map(JSONString.quote) ?? "null")}"
        }.joined(separator: ",")
        text += "],\"job\":"
        var body = Array(text.utf8)
        body += originalBody ?? original
        body += Array("},\"payload\":".utf8)
        return body + payload + [UInt8(ascii: "}")]
    }
}
