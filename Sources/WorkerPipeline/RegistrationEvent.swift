import APNsModel
import JSON
import Telemetry

/// One message on PUSH_REGISTRATIONS_QUEUE: an app reporting its device token at launch (or at logout), sent by the
/// app's backend so the cache stays fresh (the contract in docs/contract.md).
///
/// `{"user": "u1", "token": "<hex>", "environment": "production", "topic": "com.example.app.voip",
///   "timestamp": 1732900000000, "device": {"model": "iPhone15,2", "os": "17.1", "app_version": "4.2"},
///   "action": "register", "timezone": "Europe/Paris"}`
/// `topic` is the full APNs topic the token was issued for (a PushKit VoIP token: `<bundle>.voip`); without it the
/// token is a device token of the default app. `timezone` (an IANA name) is the user's, for jobs with a
/// `local_window`.
public struct RegistrationEvent: Sendable, Equatable {
    public enum Action: String, Sendable {
        /// The token belongs to the user from `timestamp` on.
        case register
        /// The user logged out on that device: stop sending there, unless it registered again later.
        case unregister
    }

    public var action: Action
    public var registration: TokenRegistration
    /// A `timezone` the event named that is not kept: a name this system's time zone database does not have (an
    /// app on a newer database), or one beside an `activity` (an update token has no user). The token is registered
    /// all the same; `timeZoneProblem` says why the zone is not.
    public var ignoredTimeZone: String?

    /// Why `ignoredTimeZone` is not kept.
    public var timeZoneProblem: String? {
        guard let ignoredTimeZone else { return nil }
        if registration.activity != nil { return "a Live Activity's update token has no user time zone" }
        return TimeZoneName.problem(ignoredTimeZone) ?? "not kept"
    }

    /// The largest event taken, in bytes.
    public static let maximumSize = 16_384

    /// Checks every field; `now` (ms) stands in for a missing timestamp.
    public static func decode(_ body: [UInt8], now: Int64) throws(JobError) -> RegistrationEvent {
        guard body.count <= maximumSize else { throw .tooLarge(size: body.count, limit: maximumSize) }
        guard String(validating: body, as: UTF8.self) != nil else { throw .notUTF8 }
        let document: JSONValue
        do { document = try JSONReader.parse(body, maximumDepth: 8) } catch { throw .notJSON(error.description) }
        guard case .object = document else { throw .notAnObject(document.typeName) }

        guard let user = try PushJob.optionalString(document, "user") else { throw .missingField("user") }
        guard !user.isEmpty, user.utf8.count <= 256 else { throw .badUser(field: "user") }
        guard let written = try PushJob.optionalString(document, "token") else { throw .missingField("token") }
        let token = APNsNotification.canonicalToken(written)
        do throws(APNsRequestError) { try APNsNotification.validateDeviceToken(token) } catch {
            throw .badToken(field: "token", error.description)
        }
        var environment = APNsEnvironment.production
        if let text = try PushJob.optionalString(document, "environment") {
            guard let parsed = APNsEnvironment(rawValue: text) else { throw .badEnvironment(text) }
            environment = parsed
        }
        let topic = try PushJob.optionalString(document, "topic")
        if let topic, !TokenScope.isValidTopic(topic) {
            throw .wrongType(
                field: "topic", expected: "an APNs topic (a bundle ID: ASCII letters, digits, \"-\" and \".\")",
                got: "\"\(JobError.echo(topic))\"")
        }
        var timestamp = now
        if let given = try PushJob.optionalInteger(document, "timestamp") {
            timestamp = try PushJob.epochMilliseconds(given, field: "timestamp", now: now)
        }
        var action = Action.register
        if let text = try PushJob.optionalString(document, "action") {
            guard let parsed = Action(rawValue: text) else {
                throw .wrongType(
                    field: "action", expected: "\"register\" or \"unregister\"", got: "\"\(JobError.echo(text))\"")
            }
            action = parsed
        }
        let deviceJSON = try device(document, body)
        let activity = try activity(document, topic: topic)
        // A zone this system does not know does not cost the user the token: it is registered without the zone.
        var timeZone = try PushJob.optionalString(document, "timezone")
        var ignoredTimeZone: String?
        if let name = timeZone, activity != nil || TimeZoneName.problem(name) != nil {
            ignoredTimeZone = name
            timeZone = nil
        }
        var event = RegistrationEvent(
            action: action,
            registration: TokenRegistration(
                user: user, token: token, scope: TokenScope(environment: environment, topic: topic),
                registeredAt: timestamp,
                deviceJSON: deviceJSON, activity: activity, timeZone: timeZone))
        event.ignoredTimeZone = ignoredTimeZone
        return event
    }

    /// The device's metadata, an object kept as written.
    private static func device(_ document: JSONValue, _ body: [UInt8]) throws(JobError) -> String? {
        guard let device = document.member("device"), device.value != .null else { return nil }
        guard case .object = device.value else {
            throw .wrongType(field: "device", expected: "an object", got: device.value.typeName)
        }
        return String(decoding: body[device.range], as: UTF8.self)
    }

    /// A Live Activity's id, beside a Live Activity topic.
    private static func activity(_ document: JSONValue, topic: String?) throws(JobError) -> String? {
        guard let activity = try PushJob.optionalString(document, "activity") else { return nil }
        guard LiveActivityID.isValid(activity) else { throw .badActivityID }
        guard topic.map({ $0.hasSuffix(APNsPushType.liveactivity.topicSuffix) }) == true else {
            throw .wrongType(
                field: "topic",
                expected: "a Live Activity topic (<bundle>.push-type.liveactivity) beside \"activity\"",
                got: topic.map { "\"\($0.prefix(60))\"" } ?? "none")
        }
        return activity
    }

    public var json: [UInt8] {
        var text = "{\"user\":\(JSONString.quote(registration.user)),\"token\":\(JSONString.quote(registration.token)),"
        text += "\"environment\":\"\(registration.scope.environment.rawValue)\","
        if let topic = registration.scope.topic { text += "\"topic\":\(JSONString.quote(topic))," }
        text += "\"timestamp\":\(registration.registeredAt),"
        if let device = registration.deviceJSON { text += "\"device\":\(device)," }
        if let activity = registration.activity { text += "\"activity\":\(JSONString.quote(activity))," }
        if let timeZone = registration.timeZone ?? ignoredTimeZone {
            text += "\"timezone\":\(JSONString.quote(timeZone)),"
        }
        text += "\"action\":\"\(action.rawValue)\"}"
        return Array(text.utf8)
    }

    public init(action: Action, registration: TokenRegistration) {
        self.action = action
        self.registration = registration
    }
}
