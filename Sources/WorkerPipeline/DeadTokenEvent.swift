import APNs
import Telemetry

/// Published on PUSH_DEAD_TOKENS_QUEUE, one per dead token (the contract in README.md).
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

    public init(token: String, user: String?, topic: String, environment: APNsEnvironment, status: Int,
                reason: String, timestamp: Int64?, jobID: String) {
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
}
