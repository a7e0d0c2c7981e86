import APNs
import JSON
import Telemetry
import WorkerPipeline

/// The job `apns-worker enqueue --user ... --alert ...` describes, as the JSON body a backend would publish (checked
/// afterwards like any other job). What a flag's value cannot be is said here, naming the flag: a job built from
/// flags has no line for a refusal to point at.
public struct JobFlags: Sendable {
    public var id: String?
    public var topic: String?
    public var users: [String] = []
    public var tokens: [String] = []
    public var environment: String?
    public var pushType: String?
    /// As given on the command line: checked and turned into numbers by `body()`.
    public var priority: String?
    public var expiration: String?
    public var deadline: String?
    public var sendAt: String?
    public var collapseID: String?
    public var alert: String?
    public var title: String?
    public var payload: String?

    public init() {}

    /// A flag's value that makes no job; the message names the flag.
    public struct Problem: Error, Sendable, Equatable, CustomStringConvertible {
        public let description: String
    }

    public func body() throws(Problem) -> [UInt8] {
        var members: [String] = []
        if let id { members.append("\"id\":\(JSONString.quote(id))") }
        if let topic { members.append("\"topic\":\(JSONString.quote(topic))") }
        if !users.isEmpty { members.append("\"users\":[\(users.map(JSONString.quote).joined(separator: ","))]") }
        if !tokens.isEmpty { members.append("\"tokens\":[\(tokens.map(JSONString.quote).joined(separator: ","))]") }
        if let environment { members.append("\"environment\":\(JSONString.quote(environment))") }
        if let pushType { members.append("\"push_type\":\(JSONString.quote(pushType))") }
        for (flag, field, text) in [
            ("--priority", "priority", priority), ("--expiration", "expiration", expiration),
            ("--send-at", "send_at", sendAt)
        ] {
            guard let text else { continue }
            members.append("\"\(field)\":\(try Self.wholeNumber(flag, text))")
        }
        if let deadline { members.append("\"deadline\":\(try Self.deadline(deadline))") }
        if let collapseID { members.append("\"collapse_id\":\(JSONString.quote(collapseID))") }
        switch (alert, payload) {
        case (let alert?, nil):
            let body =
                title.map { "{\"title\":\(JSONString.quote($0)),\"body\":\(JSONString.quote(alert))}" }
                ?? JSONString.quote(alert)
            members.append("\"payload\":{\"aps\":{\"alert\":\(body)}}")
        case (nil, let payload?):
            // One JSON object, checked: pasted as it came, text after the object ("},\"tokens\":[...]") became members
            // of the job.
            guard case .object = try? JSONReader.check(Array(payload.utf8)) else {
                throw Problem(description: "--payload wants one JSON object, e.g. '{\"aps\":{\"alert\":\"Hi\"}}'")
            }
            guard title == nil else { throw Problem(description: "--title goes with --alert, not --payload") }
            members.append("\"payload\":\(payload)")
        case (nil, nil):
            throw Problem(description: "say what to send: --alert TEXT or --payload JSON")
        case (.some, .some):
            throw Problem(description: "--alert and --payload exclude each other")
        }
        return Array("{\(members.joined(separator: ","))}".utf8)
    }

    private static func wholeNumber(_ flag: String, _ text: String) throws(Problem) -> Int64 {
        guard let number = Int64(text) else { throw Problem(description: "\(flag) wants a whole number, got \(text)") }
        return number
    }

    /// UNIX seconds, as the job's `deadline`. Milliseconds (what many clocks give) are the likely mistake: a
    /// deadline thousands of years away would never expire anything, so it is refused with the value in seconds.
    private static func deadline(_ text: String) throws(Problem) -> Int64 {
        guard let number = Int64(text), number >= 0 else {
            throw Problem(
                description: "--deadline wants UNIX seconds (the time after which the job is not sent; "
                    + "0 or later), got \(text)")
        }
        guard number <= PushJob.latestDeadline else {
            throw Problem(
                description: "--deadline wants UNIX seconds (the time after which the job is not sent), got "
                    + "\(text), beyond \(APNsRules.latestSecondsText): milliseconds? In seconds: "
                    + "--deadline \(number / 1000)")
        }
        return number
    }
}
