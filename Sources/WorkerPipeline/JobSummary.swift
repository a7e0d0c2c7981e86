import APNsModel
import JSON
import Telemetry

/// What a job's sender reads on its `reply_to` queue, for device jobs and broadcasts alike: one encoder, so that
/// both keep one shape (docs/contract.md, "Job").
struct JobSummary {
    var jobID: String
    var attempt: Int
    /// A broadcast's channel.
    var channelID: String?
    var notifications = 0
    var delivered = 0
    var dead = 0
    var failed = 0
    var retrying = 0
    var heldBack = 0
    var expired = 0
    /// Not sent: the job was cancelled.
    var cancelled = 0
    var heldBackReason: String?
    /// A job with a `local_window`: its users and tokens that wait for their hours (each part answers when it runs).
    var waitingForWindow: Int?
    var failedByReason: [String: Int] = [:]
    /// A broadcast's answer in the development environment.
    var apnsUniqueID: String?

    init(jobID: String, attempt: Int) {
        self.jobID = jobID
        self.attempt = attempt
    }

    var json: [UInt8] {
        var text = "{\"job_id\":\(JSONString.quote(jobID)),\"attempt\":\(attempt),"
        if let channelID { text += "\"channel_id\":\(JSONString.quote(channelID))," }
        text += "\"notifications\":\(notifications),\"delivered\":\(delivered),\"dead\":\(dead),\"failed\":\(failed),"
        text += "\"retrying\":\(retrying),\"held_back\":\(heldBack),\"expired\":\(expired),\"cancelled\":\(cancelled),"
        if let heldBackReason { text += "\"held_back_reason\":\(JSONString.quote(heldBackReason))," }
        if let waitingForWindow { text += "\"waiting_for_window\":\(waitingForWindow)," }
        let reasons = failedByReason.keys.sorted().map { "\(JSONString.quote($0)):\(failedByReason[$0]!)" }
        text += "\"failed_by_reason\":{\(reasons.joined(separator: ","))}"
        if let apnsUniqueID { text += ",\"apns_unique_id\":\(JSONString.quote(apnsUniqueID))" }
        return Array((text + "}").utf8)
    }

    /// The queue a job's summary goes to: its reply_to, unless it has none or an empty one (no summary asked for).
    static func replyQueue(of delivery: JobDelivery) -> String? {
        guard let replyTo = delivery.properties.replyTo, !replyTo.isEmpty else { return nil }
        return replyTo
    }

    /// The summary message to `replyTo`: with its job's correlation id (the job id if it had none), not persistent
    /// (a summary is a notice to a waiting sender, not work).
    static func publication(to replyTo: String, body: [UInt8], of delivery: JobDelivery, jobID: String) -> Publication {
        Publication(
            destination: .reply(replyTo), body: body,
            properties: MessageProperties(
                correlationID: delivery.properties.correlationID ?? PushJob.shortString(of: jobID), persistent: false))
    }
}
