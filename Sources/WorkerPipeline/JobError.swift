import APNsModel
import Foundation
import JSON
import Telemetry

/// Why a job was refused. Each names the problem so that whoever enqueued it can fix it.
public enum JobError: Error, Sendable, Equatable, CustomStringConvertible {
    case tooLarge(size: Int, limit: Int)
    case notUTF8
    case notJSON(String)
    case notAnObject(String)
    case missingField(String)
    case wrongType(field: String, expected: String, got: String)
    case noTargets
    case tooManyTargets(Int, limit: Int)
    /// `field` names the value as the sender wrote it: `users[3]` in a job, `user` in an event.
    case badUser(field: String)
    /// An activity id that is not one (`LiveActivityID`).
    case badActivityID
    case badToken(field: String, String)
    case badEnvironment(String)
    case unknownPushType(String)
    case badPriority(Int64)
    /// One of Apple's rules for a push (`APNsRules`).
    case breaksRule(APNsRequestError)
    case missingTopic
    case badDeadline(Int64)
    /// A `send_at` that cannot be waited for: not UNIX seconds, too far ahead, or after the job's deadline.
    case badSendAt(String)
    /// A `local_window` or `default_timezone` that names no hours or no known time zone.
    case localWindow(String)
    /// A `live_activity` object that ActivityKit would not take, or a job that mixes it with what it replaces.
    case liveActivity(String)
    /// A `channel_id` job that cannot be broadcast.
    case broadcast(String)

    public var description: String {
        switch self {
        case .tooLarge(let size, let limit): "message is \(size) bytes, over the \(limit)-byte limit"
        case .notUTF8: "body is not UTF-8"
        case .notJSON(let why): "body is not JSON: \(why)"
        case .notAnObject(let type): "body must be a JSON object, got \(type)"
        case .missingField(let field): "missing field \"\(field)\""
        case .wrongType(let field, let expected, let got): "\"\(field)\" must be \(expected), got \(got)"
        case .noTargets: "no targets: give \"users\" or \"tokens\" (at least one entry)"
        case .tooManyTargets(let count, let limit): "\(count) targets, over the limit of \(limit) per job"
        case .badUser(let field): "\(field) must be 1 to 256 bytes"
        case .badActivityID: "\"activity\" must be \(LiveActivityID.rule)"
        case .badToken(let field, let why): "\(field): \(why)"
        case .badEnvironment(let text): "environment \"\(Self.echo(text))\" is neither \"production\" nor \"sandbox\""
        case .unknownPushType(let text):
            "unknown push_type \"\(Self.echo(text))\" (known: \(APNsPushType.allCases.map(\.rawValue).joined(separator: ", ")))"
        case .badPriority(let value): "priority \(value): priority must be 10, 5 or 1"
        case .breaksRule(let rule): rule.description
        case .missingTopic: "no topic: the job names none and no default topic is configured"
        case .liveActivity(let why): "live_activity: \(why)"
        case .broadcast(let why): "channel_id: \(why)"
        case .badSendAt(let why): why
        case .localWindow(let why): "local_window: \(why)"
        case .badDeadline(let value):
            value < 0
                ? "deadline \(value) must be UNIX seconds, 0 or later"
                : "deadline \(value) is beyond \(APNsRules.latestSecondsText): give UNIX seconds, not milliseconds"
        }
    }
}

extension JobError {
    /// A field's text as an error (logged, and in a parked job's reason header) repeats it: at most 32 characters, so
    /// that a device token (64) or a secret sent in the wrong field does not reach the logs whole.
    public static func echo(_ text: some StringProtocol) -> String {
        text.count <= 32 ? String(text) : "\(text.prefix(32))…(\(text.count) characters)"
    }
}
