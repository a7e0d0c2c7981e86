import APNsModel
import Foundation
import JSON
import Telemetry

/// A job's `live_activity` object, checked and turned into the `aps` dictionary ActivityKit expects (Apple:
/// "Starting and updating Live Activities with ActivityKit push notifications"), so that no backend writes the
/// hyphenated keys by hand:
///
/// ```json
/// "live_activity": {"event": "update", "timestamp": 1796184000, "content_state": {"score": "2-1"},
///                   "stale_date": 1796187600, "dismissal_date": ..., "relevance_score": 50,
///                   "attributes_type": "MatchAttributes", "attributes": {...}, "alert": {"title": ..., "body": ...},
///                   "input_push_channel": "<channel id>", "input_push_token": true}
/// ```
///
/// becomes `{"aps":{"timestamp":...,"event":"update","content-state":{...},"stale-date":...,...}}`, the objects
/// copied byte for byte from the job. The rules: `event` is start, update or end; `timestamp` (UNIX seconds, the
/// moment the content was true) is required and not in the future (ActivityKit drops any update older than the
/// newest it has seen, so a timestamp ahead of the clock would silence the updates after it); every event carries
/// `content_state` (an end its final state), a start also `attributes_type`, `attributes` and `alert`; only a start
/// carries attributes and the input push channel or token.
/// An activity's id, as jobs, registrations and `tokens add --activity` name it: it becomes part of a Redis key
/// (`apns:activity:<id>`), where a brace would move a cluster's hash tag and a `*` or a space means something to
/// SCAN patterns and shells. ActivityKit's ids are UUIDs; a backend's own ids fit the same characters.
public enum LiveActivityID {
    public static let rule = "1 to 256 ASCII letters, digits, \"-\", \"_\", \".\" or \":\""

    public static func isValid(_ id: some StringProtocol) -> Bool {
        let bytes = id.utf8
        return (1...256).contains(bytes.count)
            && bytes.allSatisfy { byte in
                switch byte {
                case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                    UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."),
                    UInt8(ascii: ":"):
                    true
                default: false
                }
            }
    }
}

struct LiveActivityRequest {
    enum Event: String, CaseIterable {
        case start, update, end
    }

    /// Seconds a timestamp may run ahead of this worker's clock (the backend's clock may be a little ahead).
    static let allowedClockSkew: Int64 = 60

    static let fields: Set<String> = [
        "event", "timestamp", "content_state", "stale_date", "dismissal_date",
        "relevance_score", "attributes_type", "attributes", "alert", "input_push_channel",
        "input_push_token"
    ]

    /// The object's event and timestamp, checked (known fields only, a timestamp in seconds and not ahead of `now`).
    private static func eventAndTimestamp(_ object: JSONValue, now: Int64) throws(JobError) -> (Event, Int64) {
        guard case .object(let members) = object else {
            throw .wrongType(field: "live_activity", expected: "an object", got: object.typeName)
        }
        if let unknown = members.first(where: { !fields.contains($0.key) }) {
            throw .liveActivity("unknown field \"\(unknown.key)\" (known: \(fields.sorted().joined(separator: ", ")))")
        }
        guard let eventText = try PushJob.optionalString(object, "event") else {
            throw .liveActivity("\"event\" is required: start, update or end")
        }
        guard let event = Event(rawValue: eventText) else {
            throw .liveActivity("\"event\" is \"\(JobError.echo(eventText))\", not start, update or end")
        }
        guard let timestamp = try PushJob.optionalInteger(object, "timestamp") else {
            throw .liveActivity("\"timestamp\" is required: the UNIX seconds at which this content was true")
        }
        guard timestamp <= now + allowedClockSkew else {
            throw .liveActivity(
                timestamp > PushJob.latestDeadline
                    ? "\"timestamp\" \(timestamp) looks like milliseconds: give UNIX seconds"
                    : "\"timestamp\" \(timestamp) is \(timestamp - now) s in the future: ActivityKit would drop every "
                        + "update older than it")
        }
        return (event, timestamp)
    }

    /// The payload for `member` (the job's `live_activity`), read from `body`; `now` in UNIX seconds.
    static func payload(_ member: JSONMember, body: [UInt8], now: Int64) throws(JobError) -> [UInt8] {
        let (event, timestamp) = try eventAndTimestamp(member.value, now: now)
        var aps = "{\"timestamp\":\(timestamp),\"event\":\"\(event.rawValue)\""
        func copyObject(_ field: String, as key: String, requiredBy required: Bool) throws(JobError) {
            guard let found = member.value.member(field), found.value != .null else {
                if required { throw .liveActivity("\(event.named) needs \"\(field)\"") }
                return
            }
            guard case .object = found.value else {
                throw .wrongType(field: "live_activity.\(field)", expected: "an object", got: found.value.typeName)
            }
            aps += ",\"\(key)\":" + String(decoding: body[found.range], as: UTF8.self)
        }
        func integer(_ field: String, as key: String) throws(JobError) {
            guard let value = try PushJob.optionalInteger(member.value, field) else { return }
            guard value <= PushJob.latestDeadline else {
                throw .liveActivity("\"\(field)\" \(value) looks like milliseconds: give UNIX seconds")
            }
            aps += ",\"\(key)\":\(value)"
        }
        // Apple: an end, too, carries the final content state.
        try copyObject("content_state", as: "content-state", requiredBy: true)
        try integer("stale_date", as: "stale-date")
        try integer("dismissal_date", as: "dismissal-date")
        switch member.value["relevance_score"] {
        case nil, .null?: break
        case .number(let text)?: aps += ",\"relevance-score\":\(text)"
        case let other?:
            throw .wrongType(field: "live_activity.relevance_score", expected: "a number", got: other.typeName)
        }
        let startOnly = ["attributes_type", "attributes", "input_push_channel", "input_push_token"]
        if event == .start {
            guard let type = try PushJob.optionalString(member.value, "attributes_type"), !type.isEmpty else {
                throw .liveActivity("a start needs \"attributes_type\": the name of the app's ActivityAttributes type")
            }
            aps += ",\"attributes-type\":" + JSONString.quote(type)
            try copyObject("attributes", as: "attributes", requiredBy: true)
            if let channel = try PushJob.optionalString(member.value, "input_push_channel") {
                aps += ",\"input-push-channel\":" + JSONString.quote(channel)
            }
            switch member.value["input_push_token"] {
            case nil, .null?, .bool(false)?: break
            case .bool(true)?: aps += ",\"input-push-token\":1"
            case let other?:
                throw .wrongType(
                    field: "live_activity.input_push_token", expected: "true or false",
                    got: other.typeName)
            }
        } else if let given = startOnly.first(where: { member.value[$0] != nil }) {
            throw .liveActivity("\"\(given)\" belongs to a start only, not \(event.named)")
        }
        try copyObject("alert", as: "alert", requiredBy: event == .start)
        return Array(("{\"aps\":" + aps + "}}").utf8)
    }
}

extension LiveActivityRequest.Event {
    /// "a start", "an update", "an end": for messages.
    var named: String { self == .start ? "a start" : "an \(rawValue)" }
}
