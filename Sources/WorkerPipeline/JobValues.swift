import JSON

/// A job's scalar members as `PushJob.decode` and the parts of a job it hands on (`local_window`, `live_activity`)
/// read them: a type other than the one a member takes is refused, naming the member.
extension PushJob {
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
}
