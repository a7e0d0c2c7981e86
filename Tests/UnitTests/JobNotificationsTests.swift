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
        let (job, progress) = try Self.progress(of: body, environments: [.production, .sandbox])
        let targets = progress.targets
        let first = progress.notification(0)
        for second in [progress.notification(1), progress.notification(1, sharingWith: first)] {
            #expect(second.deviceToken == targets[1].token && second.environment == .sandbox)
            #expect(second.topic == job.topic && second.pushType == .background && second.priority == job.priority)
            #expect(second.expiration == 60 && second.collapseID == "c" && second.payload == job.payload)
            #expect(second.sharesFields(with: first))
        }
        #expect(first.deviceToken == targets[0].token && first.environment == .production)
    }

    /// A job's notifications share its box (`PushJobStorage`): a field changed on one of them changes neither the
    /// job nor the job's other notifications, and a job changed after its notifications were made (a part of it, its
    /// rate group) changes neither them nor the job it was copied from.
    @Test func changingANotificationOrItsJobChangesNothingElse() throws {
        let body = #"{"id":"j","collapse_id":"c","users":["alice","bob"],"payload":{"aps":{"alert":"hi"}}}"#
        let (job, progress) = try Self.progress(of: body, environments: [.production, .production])
        let payload = job.payload
        var changed = progress.notification(0)
        changed.collapseID = "other"
        changed.payload = [1]
        changed.apnsID = "00000000-0000-0000-0000-000000000001"
        #expect(changed.collapseID == "other" && changed.payload == [1])
        #expect(job.collapseID == "c" && job.payload == payload && progress.job.collapseID == "c")
        let sibling = progress.notification(1)
        #expect(sibling.collapseID == "c" && sibling.payload == payload && sibling.apnsID == nil)
        var part = job.reaching(users: ["bob"], tokens: [])
        part.rateGroup = RateGroup(name: "team", perSecond: 10)
        #expect(part.users == ["bob"] && part.rateGroup?.name == "team" && part.collapseID == "c")
        #expect(job.users == ["alice", "bob"] && job.rateGroup == nil)
        #expect(sibling.collapseID == "c" && progress.notification(0).collapseID == "c")
    }

    /// A job's payload is not copied out of its body: its notifications read it where the body holds it, whichever
    /// reading decoded the job (the usual one-pass reading; the member-by-member one, here for an upper-case token).
    @Test func aJobsNotificationsReadItsPayloadWhereItsBodyHoldsIt() throws {
        for token in [String(repeating: "0a", count: 32), String(repeating: "0A", count: 32)] {
            let payload = #"{"aps":{"alert":"hi"}}"#
            let body = Array(#"{"id":"j","tokens":["\#(token)"],"payload":\#(payload)}"#.utf8)
            let job = try PushJob.decode(body, defaultTopic: "com.example.app", fallbackID: "-")
            let delivery = JobDelivery(tag: 1, redelivered: false, body: body, properties: MessageProperties())
            let progress = JobProgress(
                job: job, delivery: delivery, generation: 1,
                targets: [DeviceTarget(token: token.lowercased(), environment: .production, user: nil)],
                hasStableID: true)
            let notification = progress.notification(0)
            #expect(notification.payload == Array(payload.utf8) && job.payload == Array(payload.utf8))
            let start = try #require(body.firstRange(of: Array(payload.utf8))).lowerBound
            let inBody = body.withUnsafeBufferPointer { $0.baseAddress! + start }
            #expect(notification.payloadBytes.withUnsafeBufferPointer { $0.baseAddress } == inBody, "\(token)")
        }
    }

    /// The job `body` decodes to, and its progress towards a target in each environment (tokens 0a..., 0b..., ...).
    static func progress(of body: String, environments: [APNsEnvironment]) throws -> (PushJob, JobProgress) {
        let job = try PushJob.decode(Array(body.utf8), defaultTopic: "com.example.app", fallbackID: "-")
        let targets = environments.enumerated().map { index, environment in
            DeviceTarget(
                token: String(repeating: "0\(Character(Unicode.Scalar(UInt8(97 + index))))", count: 32),
                environment: environment, user: "alice")
        }
        let delivery = JobDelivery(tag: 1, redelivered: false, body: Array(body.utf8), properties: MessageProperties())
        return (job, JobProgress(job: job, delivery: delivery, generation: 1, targets: targets, hasStableID: true))
    }
}
