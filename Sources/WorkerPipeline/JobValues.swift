import JSON

/// A job's scalar members as `PushJob.decode` and the parts of a job it hands on (`local_window`, `live_activity`)
/// read them: a type other than the one a member takes is refused, naming the member.
extension PushJob {
    /// Far above APNS_MAX_ATTEMPTS (at most 100): an attempt counted in a retry's state or a broadcast copy's header
    /// beyond it is not the worker's (and one more than Int.max would trap).
    static let maximumAttempt = 1_000_000

    /// `value` if it reads as milliseconds since the epoch, from September 2001 to a day after `now` (ms; without
    /// it, to `latestDeadline`); otherwise the error naming `field` and the likely unit. A time in seconds would make a registration
    /// look decades old (the inactivity sweep then removes its token), one in microseconds a registration no later
    /// event could ever supersede.
    static func epochMilliseconds(_ value: Int64, field: String, now: Int64? = nil) throws(JobError) -> Int64 {
        let expected = "ms since the epoch"
        guard value > 0 else { throw .wrongType(field: field, expected: expected, got: "\(value)") }
        guard value >= 1_000_000_000_000 else {
            throw .wrongType(field: field, expected: expected, got: "\(value), before 2001 in ms: seconds?")
        }
        guard value <= (now.map { $0 + 86_400_000 } ?? latestDeadline * 1000) else {
            let bound = now == nil ? "after the year 5138" : "over a day ahead"
            throw .wrongType(field: field, expected: expected, got: "\(value), \(bound): microseconds?")
        }
        return value
    }

    static func optionalString(_ document: JSONValue, _ field: String) throws(JobError) -> String? {
        try string(document[field], named: field)
    }

    static func optionalInteger(_ document: JSONValue, _ field: String) throws(JobError) -> Int64? {
        try integer(document[field], named: field)
    }

    /// A member's value that must be a string or null (or absent: nil).
    static func string(_ value: JSONValue?, named field: String) throws(JobError) -> String? {
        switch value {
        case nil, .null?: return nil
        case .string(let text)?: return text
        case let other?: throw .wrongType(field: field, expected: "a string", got: other.typeName)
        }
    }

    /// A member's value that must be a whole number written as one, or null (or absent: nil).
    static func integer(_ value: JSONValue?, named field: String) throws(JobError) -> Int64? {
        switch value {
        case nil, .null?: return nil
        case .number(let text)?:
            guard let value = Int64(text) else {
                throw .wrongType(field: field, expected: "a whole number", got: "the number \(text)")
            }
            return value
        case let other?: throw .wrongType(field: field, expected: "a whole number", got: other.typeName)
        }
    }

    /// The members that say how a job's notifications are sent, as typed values: read from the job's members
    /// (`JobMembers`), or straight from its bytes (`decodeUsual`); `SendingOptions` judges them.
    struct SendingMembers {
        var environment, pushType, collapseID: String?
        var priority, expiration, deadline, sendAt: Int64?

        init() {}

        /// Each member of the type it takes, or the error naming it.
        init(_ members: borrowing JobMembers) throws(JobError) {
            environment = try string(members.environment, named: "environment")
            pushType = try string(members.pushType, named: "push_type")
            priority = try integer(members.priority, named: "priority")
            expiration = try integer(members.expiration, named: "expiration")
            deadline = try integer(members.deadline, named: "deadline")
            sendAt = try integer(members.sendAt, named: "send_at")
            collapseID = try string(members.collapseID, named: "collapse_id")
        }
    }
}

extension PushJob {
    /// A job id as an AMQP short string (a correlation id, a message-id) of at most 255 bytes: a longer id (ids have
    /// no limit) is cut, with a hash of the whole, so that two stay two. Whole, it could not be published, and the
    /// session that tried ended, over and over.
    public static func shortString(of jobID: String) -> String {
        guard jobID.utf8.count > 255 else { return jobID }
        var cut = ""
        for scalar in jobID.unicodeScalars {
            guard cut.utf8.count + scalar.utf8.count <= 238 else { break }
            cut.unicodeScalars.append(scalar)
        }
        return cut + "~" + DeliveryTriage.fingerprint(Array(jobID.utf8))
    }
}
