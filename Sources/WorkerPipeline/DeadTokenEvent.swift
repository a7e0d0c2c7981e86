import APNsModel
import JSON
import Telemetry

/// Published on PUSH_DEAD_TOKENS_QUEUE, one per dead token (the contract in docs/contract.md).
public struct DeadTokenEvent: Sendable, Equatable {
    public var token: String
    public var user: String?
    public var topic: String
    public var environment: APNsEnvironment
    public var status: Int
    public var reason: String
    /// APNs's `timestamp` (ms since epoch) from a 410 body; nil where APNs gave none.
    public var timestamp: Int64?
    public var jobID: String

    public init(
        token: String, user: String?, topic: String, environment: APNsEnvironment, status: Int,
        reason: String, timestamp: Int64?, jobID: String
    ) {
        self.token = token
        self.user = user
        self.topic = topic
        self.environment = environment
        self.status = status
        self.reason = reason
        self.timestamp = timestamp
        self.jobID = jobID
    }

    public var json: [UInt8] {
        var text = "{\"token\":\(JSONString.quote(token)),\"user\":\(user.map(JSONString.quote) ?? "null"),"
        text += "\"topic\":\(JSONString.quote(topic)),\"environment\":\"\(environment.rawValue)\","
        text += "\"status\":\(status),\"reason\":\(JSONString.quote(reason)),"
        text += "\"timestamp\":\(timestamp.map(String.init) ?? "null"),\"job_id\":\(JSONString.quote(jobID))}"
        return Array(text.utf8)
    }

    /// Reads an event as the worker publishes it (consumers such as `apns-worker cleanup`); strict about the token,
    /// lenient about what it does not need.
    public static func decode(_ body: [UInt8]) throws(JobError) -> DeadTokenEvent {
        guard body.count <= 16_384 else { throw .tooLarge(size: body.count, limit: 16_384) }
        let document: JSONValue
        do { document = try JSONReader.parse(body, maximumDepth: 4) } catch { throw .notJSON(error.description) }
        guard case .object = document else { throw .notAnObject(document.typeName) }
        guard let token = try PushJob.optionalString(document, "token") else { throw .missingField("token") }
        do throws(APNsRequestError) { try APNsNotification.validateDeviceToken(token) } catch {
            throw .badToken(field: "token", error.description)
        }
        let environmentText = try PushJob.optionalString(document, "environment") ?? "production"
        guard let environment = APNsEnvironment(rawValue: environmentText) else {
            throw .badEnvironment(environmentText)
        }
        // Only APNs's answers that say a token is dead make these events: any other status is not one, and a
        // removal unless registered after a time that is not APNs's would be a guess.
        let status = try PushJob.optionalInteger(document, "status") ?? 410
        guard status == 410 || status == 400 else {
            throw .wrongType(field: "status", expected: "410 or 400, APNs's answers for a dead token", got: "\(status)")
        }
        let topic = try PushJob.optionalString(document, "topic") ?? ""
        if !topic.isEmpty && !TokenScope.isValidTopic(topic) {
            throw .wrongType(
                field: "topic", expected: "an APNs topic (a bundle ID)", got: "\"\(JobError.echo(topic))\"")
        }
        return DeadTokenEvent(
            token: token, user: try PushJob.optionalString(document, "user"), topic: topic, environment: environment,
            status: Int(status), reason: try PushJob.optionalString(document, "reason") ?? "",
            timestamp: try PushJob.optionalInteger(document, "timestamp").map { value throws(JobError) in
                try PushJob.epochMilliseconds(value, field: "timestamp")
            },
            jobID: try PushJob.optionalString(document, "job_id") ?? "")
    }

    /// The cache values (`TokenScope`) of the entries this event may remove: those its topic reaches in its
    /// environment. An event that names no topic (published by another system) is about the default app's tokens.
    public func cacheValuesItRemoves(defaultTopic: String?) -> [String] {
        guard !topic.isEmpty else {
            return [environment.rawValue]
                + (defaultTopic.map { [TokenScope(environment: environment, topic: $0).cacheValue] } ?? [])
        }
        return TopicMatcher(topic: topic, defaultTopic: defaultTopic).cacheValues(in: environment)
    }

    /// The event as JSON with the token shortened, for people watching (`dead-tokens tail`).
    public var redactedJSON: [UInt8] {
        var copy = self
        copy.token = Redact.token(token)
        return copy.json
    }
}
