import APNs
import Foundation
import Telemetry
import Testing
import WorkerPipeline

/// Broadcasts and work whose credential went away settle by the rules device jobs keep, specified over the
/// in-memory ports: answers read with the broadcast route's table, retries, parking, one summary, nothing sent twice.
@Suite struct SettlementByTheRulesTests {
    typealias Spec = WorkerTests
    static let channel = "AZTvW5MSSFuwBMDpdBKaJA=="

    static func broadcastJob(_ id: String) -> String {
        #"{"id":"\#(id)","channel_id":"\#(channel)","payload":{"aps":{"event":"update","timestamp":1,"content-state":{}}}}"#
    }

    static func summary(_ publication: Publication?) throws -> [String: Any] {
        let body = try #require(publication).body
        return try #require(try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any])
    }

    @Test func aBroadcastAnswered410FailsAndRemovesNothing() throws {
        let fleet = InMemoryFleet()
        let running = Spec.Running(fleet) { _ in
            APNsResponse(status: 200)
        } broadcastAnswer: { _ in
            APNsResponse(status: 410, reason: .unregistered, timestamp: 1_700_000_000_000)
        }
        let tag = fleet.deliver(Self.broadcastJob("gone"), properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        let published = fleet.read(\.published)
        #expect(published.map(\.destination) == [.reply("replies")], "a summary, no dead-token event, not parked")
        let summary = try Self.summary(published.first)
        #expect(
            summary["failed"] as? Int == 1 && summary["dead"] as? Int == 0
                && summary["channel_id"] as? String == Self.channel, "\(summary)")
        #expect(fleet.read(\.removals).isEmpty)
        #expect(running.worker.statistics.deadTokens.load(ordering: .relaxed) == 0)
    }

    @Test func aThrottledBroadcastGoesToItsDelayQueueThenIsParkedWhenItsAttemptsAreSpent() throws {
        let fleet = InMemoryFleet()
        let running = Spec.Running(fleet, settings: Spec.settings(attempts: 2)) { _ in
            APNsResponse(status: 200)
        } broadcastAnswer: { _ in
            APNsResponse(status: 429, reason: .tooManyRequests)
        }
        let body = Self.broadcastJob("busy")
        let first = fleet.deliver(body)
        #expect(fleet.wait { $0.acknowledged.contains(first) })
        let retry = try #require(fleet.read { $0.published.first })
        #expect(retry.destination == .retry(delay: 60, lane: .urgent), "429 suggests 60 s")
        #expect(retry.properties.headers["x-apns-worker-broadcast-attempt"] == "2")
        let second = fleet.deliver(String(decoding: retry.body, as: UTF8.self), properties: retry.properties)
        #expect(fleet.wait { $0.acknowledged.contains(second) })
        running.stop()
        let parked = try #require(fleet.read { $0.published.dropFirst().first })
        #expect(parked.destination == .failed && String(decoding: parked.body, as: UTF8.self) == body)
        #expect(
            parked.properties.headers[Worker.reasonHeader]
                == "broadcast not delivered after 2 attempts: TooManyRequests")
        let statistics = running.worker.statistics
        #expect(statistics.jobsParked.load(ordering: .relaxed) == 1 && statistics.retries.load(ordering: .relaxed) == 1)
        #expect(fleet.read(\.broadcastsSent) == [Self.channel, Self.channel])
    }

    /// The idempotency record says an earlier delivery broadcast (its worker died before the acknowledgement): the
    /// redelivery is acknowledged with no broadcast and no summary.
    @Test func aRedeliveredBroadcastThatWentOutIsNotSentOrSummarisedAgain() throws {
        let fleet = InMemoryFleet()
        fleet.change { state in
            state.settled["once"] = Settled()
            state.settled["once"]?.add(.done(Self.channel))
        }
        let running = Spec.Running(fleet)
        let redelivery = fleet.deliver(
            Self.broadcastJob("once"), properties: MessageProperties(replyTo: "replies"),
            redelivered: true)
        #expect(fleet.wait { $0.acknowledged.contains(redelivery) })
        running.stop()
        #expect(fleet.read(\.broadcastsSent).isEmpty, "not broadcast again")
        #expect(fleet.read(\.published).isEmpty, "no summary")
        #expect(running.worker.statistics.duplicatesAvoided.load(ordering: .relaxed) == 1)
    }

    /// A broadcast whose retry copy the broker did not take is given back and settled again: its attempt's summary
    /// went out the first time and does not again, and nothing is counted until it settles.
    @Test func aBroadcastGivenBackPublishesItsAttemptsSummaryOnce() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.missingQueues = [.retry(delay: 60, lane: .urgent)] }
        let running = Spec.Running(fleet) { _ in
            APNsResponse(status: 200)
        } broadcastAnswer: { _ in
            APNsResponse(status: 429, reason: .tooManyRequests)
        }
        let properties = MessageProperties(replyTo: "replies", messageID: "given-back")
        let first = fleet.deliver(Self.broadcastJob("given-back"), properties: properties)
        #expect(fleet.wait { $0.requeued.contains(first) }, "its retry copy was not taken: given back")
        let again = fleet.deliver(Self.broadcastJob("given-back"), properties: properties, redelivered: true)
        #expect(fleet.wait { $0.requeued.contains(again) })
        running.stop()
        #expect(fleet.read(\.broadcastsSent).count == 2, "sent again: APNs had not taken it")
        let summaries = fleet.read { $0.published.filter { $0.destination == .reply("replies") } }
        #expect(summaries.count == 1, "attempt 1's summary once, not once per delivery")
        let statistics = running.worker.statistics
        #expect(
            statistics.broadcastCount("retrying") == 0 && statistics.retries.load(ordering: .relaxed) == 0,
            "counted when settled, not when given back")
    }

    /// A job taken, whose topic no credential serves any more when its notifications go out (a reload took it
    /// away): parked with the reason and what is left of it, nothing sent, nothing counted as sent.
    @Test func workWhoseCredentialWentAwayIsParkedWithWhatIsLeft() throws {
        let fleet = InMemoryFleet()
        let running = Spec.Running(fleet)
        running.sender.unserved.withLock { $0 = [Spec.topic] }
        let tokens = [Spec.token(1), Spec.token(2), Spec.token(3)]
        let tag = fleet.deliver(Spec.job("orphan", tokens: tokens), properties: MessageProperties(replyTo: "replies"))
        let broadcast = fleet.deliver(Self.broadcastJob("orphan-broadcast"))
        #expect(fleet.wait { $0.acknowledged.contains(tag) && $0.acknowledged.contains(broadcast) })
        running.stop()
        let published = fleet.read(\.published)
        let parked = published.filter { $0.destination == .failed }
        #expect(parked.count == 2, "\(published.map(\.destination))")
        let job = try PushJob.decode(
            try #require(parked.first { $0.body.count > 200 }).body, defaultTopic: nil,
            fallbackID: "-")
        #expect(job.retryTargets?.map(\.token) == tokens, "parked with the notifications left to send")
        #expect(
            parked.allSatisfy {
                $0.properties.headers[Worker.reasonHeader]?.contains("no APNs credential serves topic \(Spec.topic)")
                    == true
            }, "\(parked.map { $0.properties.headers[Worker.reasonHeader] ?? "" })")
        let summary = try Self.summary(published.first { $0.destination == .reply("replies") })
        #expect(summary["notifications"] as? Int == 3 && summary["delivered"] as? Int == 0, "\(summary)")
        #expect(fleet.read(\.sent).isEmpty && fleet.read(\.broadcastsSent).isEmpty)
        let statistics = running.worker.statistics
        #expect(statistics.sent[.urgent] == 0, "refused before any request: not counted as sent")
        #expect(statistics.jobsParked.load(ordering: .relaxed) == 2)
    }

    /// A job addressing a Live Activity reaches the activity's update tokens; a dead one (410) leaves the activity,
    /// with its dead-token event, and the live one stays.
    @Test func aDeadUpdateTokenLeavesItsActivity() throws {
        let fleet = InMemoryFleet()
        let dead = Spec.token(7)
        let live = Spec.token(8)
        let scope = TokenScope(environment: .production, topic: Spec.topic + ".push-type.liveactivity")
        fleet.change { $0.activities = ["match": [dead, live].map { CachedToken(token: $0, scope: scope) }] }
        let running = Spec.Running(fleet) { notification in
            notification.deviceToken == dead
                ? APNsResponse(status: 410, reason: .unregistered, timestamp: 1_000)
                : APNsResponse(status: 200)
        }
        let tag = fleet.deliver(
            #"{"id":"minute","topic":"\#(Spec.topic)","activity":"match","live_activity":{"event":"update","timestamp":1,"content_state":{}}}"#
        )
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(fleet.read(\.sent).map(\.token).sorted() == [dead, live])
        #expect(fleet.read(\.published).map(\.destination) == [.deadTokens], "one dead-token event")
        #expect(fleet.read(\.activities)["match"]?.map(\.token) == [live], "the dead update token left its activity")
        #expect(fleet.read(\.removals).map(\.activity) == ["match"])
    }

    /// A job redelivered after part of it was answered: its one summary counts every notification, over both
    /// deliveries, as the idempotency record keeps them.
    @Test func aRedeliveredJobsSummaryCountsEveryDelivery() throws {
        let fleet = InMemoryFleet()
        let failing = Spec.token(3)
        fleet.change { state in
            state.settled["split"] = Settled()
            state.settled["split"]?.add(.done(Spec.token(1)))
            state.settled["split"]?.add(.failed(failing, reason: "BadTopic"))
        }
        let running = Spec.Running(fleet)
        let tokens = [Spec.token(1), failing, Spec.token(2)]
        let tag = fleet.deliver(
            Spec.job("split", tokens: tokens), properties: MessageProperties(replyTo: "replies"),
            redelivered: true)
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(fleet.read(\.sent).map(\.token) == [Spec.token(2)], "only what no delivery settled")
        let summary = try Self.summary(fleet.read { $0.published.first })
        #expect(
            summary["notifications"] as? Int == 3 && summary["delivered"] as? Int == 2 && summary["failed"] as? Int == 1
                && summary["failed_by_reason"] as? [String: Int] == ["BadTopic": 1], "\(summary)")
    }
}
