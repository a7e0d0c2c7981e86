import APNs
import Testing

@testable import WorkerPipeline

@Suite struct SettlementPlanTests {
    static let topic = "com.example.app"

    static func token(_ number: Int) -> String { String(format: "%064x", number) }

    /// A finished job with three notifications: delivered, dead (410) and APNs asked to retry.
    func finishedJob(replyTo: String? = nil) throws -> JobProgress {
        let body = #"{"id":"j-1","topic":"\#(Self.topic)","users":["alice"],"payload":{"aps":{}}}"#
        let job = try PushJob.decode(Array(body.utf8), defaultTopic: Self.topic, fallbackID: "-")
        let delivery = JobDelivery(
            tag: 7, redelivered: false, body: Array(body.utf8),
            properties: MessageProperties(replyTo: replyTo, correlationID: "c-1"))
        let targets = (1...3).map { DeviceTarget(token: Self.token($0), environment: .production, user: "alice") }
        let progress = JobProgress(job: job, delivery: delivery, generation: 1, targets: targets, hasStableID: true)
        progress.recordDelivered(0)
        progress.recordDead(1, APNsResponse(status: 410, reason: .unregistered, timestamp: 1_796_184_000_042))
        progress.recordRetryable(2, reason: "ServiceUnavailable", label: "ServiceUnavailable", delay: 15)
        return progress
    }

    /// Whether a job needs a plan is decided without making one (most jobs need none): it must say yes exactly when
    /// the plan would publish or remove something, whatever the job's outcomes, retry decision and reply_to.
    @Test func aJobNeedsAPlanExactlyWhenItsPlanHasSomethingToDo() throws {
        let body = #"{"id":"j-2","topic":"\#(Self.topic)","users":["bob"],"payload":{"aps":{}}}"#
        let job = try PushJob.decode(Array(body.utf8), defaultTopic: Self.topic, fallbackID: "-")
        let decisions: [RetryPolicy.Decision] = [.none, .expire, .retry(delay: 15), .park]
        var seen: Set<Bool> = []
        for replyTo in [nil, "", "replies"] as [String?] {
            for dead in [false, true] {
                for summarySent in [false, true] {
                    for decision in decisions {
                        let delivery = JobDelivery(
                            tag: 9, redelivered: false, body: Array(body.utf8),
                            properties: MessageProperties(replyTo: replyTo))
                        let targets = (1...2).map {
                            DeviceTarget(token: Self.token($0), environment: .production, user: "bob")
                        }
                        let progress = JobProgress(
                            job: job, delivery: delivery, generation: 1, targets: targets,
                            hasStableID: true)
                        progress.recordDelivered(0)
                        if dead {
                            progress.recordDead(1, APNsResponse(status: 410, reason: .unregistered, timestamp: 7))
                        } else {
                            progress.recordDelivered(1)
                        }
                        progress.summarySent = summarySent
                        let plan = SettlementPlan(progress, retry: decision, defaultTopic: Self.topic)
                        let hasWork = !plan.publications.isEmpty || !plan.removals.isEmpty
                        #expect(
                            SettlementPlan.isNeeded(for: progress, retry: decision) == hasWork,
                            "reply_to \(replyTo ?? "none"), dead \(dead), summary sent \(summarySent), \(decision)")
                        seen.insert(hasWork)
                    }
                }
            }
        }
        #expect(seen == [false, true], "both kinds of job are among the cases")
    }

    @Test func aDeadTokenIsAnEventAndARemovalBoundToTheJobsTopic() throws {
        let plan = SettlementPlan(try finishedJob(), retry: .retry(delay: 15), defaultTopic: Self.topic)
        let event = try DeadTokenEvent.decode(plan.publications[0].body)
        #expect(plan.publications[0].destination == .deadTokens)
        #expect(event.token == Self.token(2) && event.timestamp == 1_796_184_000_042 && event.jobID == "j-1")
        #expect(
            plan.removals == [
                TokenRemoval(
                    user: "alice", token: Self.token(2), unlessRegisteredAfter: 1_796_184_000_042,
                    onlyIfValueIn: ["production:com.example.app", "production"])
            ])
    }

    @Test func aRetryCarriesOnlyWhatFailedToTheDelayQueueOfItsLane() throws {
        let plan = SettlementPlan(try finishedJob(), retry: .retry(delay: 15), defaultTopic: Self.topic)
        #expect(plan.publications.map(\.destination) == [.deadTokens, .retry(delay: 15, lane: .urgent)])
        let retry = try PushJob.decode(plan.publications[1].body, defaultTopic: nil, fallbackID: "-")
        #expect(retry.retryTargets?.map(\.token) == [Self.token(3)] && retry.attempt == 2)
        #expect(plan.publications[1].properties.headers[Worker.reasonHeader] == "ServiceUnavailable")
        #expect(plan.parkedReason == nil)
    }

    @Test func aParkedJobGoesToTheFailedQueueWithWhatHappened() throws {
        let plan = SettlementPlan(try finishedJob(), retry: .park, defaultTopic: Self.topic)
        let parked = plan.publications[1]
        #expect(parked.destination == .failed)
        #expect(parked.properties.headers[Worker.undeliveredHeader] == Self.token(3))
        #expect(plan.parkedReason == "1 of 3 notifications not delivered after 1 attempts: ServiceUnavailable")
    }

    @Test func expiredOrNothingToRetryPublishesOnlyTheEvents() throws {
        for decision in [RetryPolicy.Decision.expire, .none] {
            let plan = SettlementPlan(try finishedJob(), retry: decision, defaultTopic: Self.topic)
            #expect(plan.publications.map(\.destination) == [.deadTokens])
        }
    }

    @Test func theJobIsSafeOnceAllButItsSummaryWereTaken() throws {
        let plan = SettlementPlan(
            try finishedJob(replyTo: "replies"), retry: .retry(delay: 15), defaultTopic: Self.topic)
        #expect(plan.summary == 2 && plan.publications[2].destination == .reply("replies"))
        #expect(plan.publications[2].properties.correlationID == "c-1")
        let summaryLost: [PublicationOutcome] = [.taken, .taken, .noQueue]
        #expect(plan.isSafe(summaryLost[...]) && plan.summaryLost(summaryLost[...]))
        let eventLost: [PublicationOutcome] = [.refused, .taken, .taken]
        #expect(!plan.isSafe(eventLost[...]) && !plan.summaryLost(eventLost[...]))
        // A plan's outcomes are a slice of a larger batch's.
        let batch: [PublicationOutcome] = [.refused, .taken, .taken, .taken]
        #expect(plan.isSafe(batch[1...]))
    }

    @Test func aTokenSentDirectlyIsNotRemovedFromAnyUsersEntry() throws {
        let body = #"{"id":"direct","topic":"\#(Self.topic)","tokens":["\#(Self.token(1))"],"payload":{"aps":{}}}"#
        let job = try PushJob.decode(Array(body.utf8), defaultTopic: Self.topic, fallbackID: "-")
        let progress = JobProgress(
            job: job, delivery: JobDelivery(tag: 1, redelivered: false, body: [], properties: .init()),
            generation: 1, targets: [DeviceTarget(token: Self.token(1), environment: .production, user: nil)],
            hasStableID: true)
        progress.recordDead(0, APNsResponse(status: 410))
        let plan = SettlementPlan(progress, retry: .none, defaultTopic: Self.topic)
        #expect(plan.publications.count == 1 && plan.removals.isEmpty)
    }
}
