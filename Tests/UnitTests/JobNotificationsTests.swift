import APNs
import Testing

@testable import WorkerPipeline

/// What a job sends each of its targets (`JobProgress.notification`).
@Suite struct JobNotificationsTests {
    /// Made alone or lent a sibling's message, a notification carries its own target's token and environment and
    /// the job's fields.
    @Test func eachNotificationCarriesItsTargetAndTheJobsFields() throws {
        let body =
            #"{"id":"j","topic":"com.example.app","push_type":"background","expiration":60,"collapse_id":"c","users":["alice"],"payload":{"aps":{"content-available":1}}}"#
        let job = try PushJob.decode(Array(body.utf8), defaultTopic: "com.example.app", fallbackID: "-")
        let targets = [
            DeviceTarget(token: String(repeating: "0a", count: 32), environment: .production, user: "alice"),
            DeviceTarget(token: String(repeating: "0b", count: 32), environment: .sandbox, user: "alice")
        ]
        let delivery = JobDelivery(tag: 1, redelivered: false, body: Array(body.utf8), properties: MessageProperties())
        let progress = JobProgress(job: job, delivery: delivery, generation: 1, targets: targets, hasStableID: true)
        let first = progress.notification(0)
        for second in [progress.notification(1), progress.notification(1, sharingWith: first)] {
            #expect(second.deviceToken == targets[1].token && second.environment == .sandbox)
            #expect(second.topic == job.topic && second.pushType == .background && second.priority == job.priority)
            #expect(second.expiration == 60 && second.collapseID == "c" && second.payload == job.payload)
            #expect(second.sharesFields(with: first))
        }
        #expect(first.deviceToken == targets[0].token && first.environment == .production)
    }
}
