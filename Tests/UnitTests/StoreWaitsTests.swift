import APNs
import Foundation
import Telemetry
import Testing
import WorkerPipeline

/// Jobs that meet a Redis node that does not answer (a cluster master lost): the rule, and the real `Worker` over
/// in-memory ports whose store has such a node.
@Suite struct StoreWaitsTests {
    typealias W = WorkerTests

    static func delivery(headers: MessageHeaders = [:], lane: JobLane = .urgent) -> JobDelivery {
        JobDelivery(
            tag: 7, redelivered: false, body: Array("{}".utf8),
            properties: MessageProperties(messageID: "m-1", headers: headers), lane: lane)
    }

    @Test func delaysGrowTierByTierAsWaitsAddUp() {
        let waits = StoreWaits(delays: [60, 1, 15])
        #expect(waits.delay(afterWaits: 0) == 1)
        #expect(waits.delay(afterWaits: StoreWaits.waitsPerTier - 1) == 1)
        #expect(waits.delay(afterWaits: StoreWaits.waitsPerTier) == 15)
        #expect(waits.delay(afterWaits: 2 * StoreWaits.waitsPerTier) == 60)
        #expect(waits.delay(afterWaits: 1_000_000) == 60, "the longest tier repeats")
    }

    @Test func theWaitingCopyKeepsTheJobAndCountsItsWaits() throws {
        let waits = StoreWaits(delays: [1, 15])
        let first = waits.waitingCopy(of: Self.delivery(lane: .bulk))
        #expect(first.destination == .retry(delay: 1, lane: .bulk), "its own lane's shortest delay queue")
        #expect(first.body == Array("{}".utf8) && first.properties.messageID == "m-1" && first.properties.persistent)
        #expect(first.properties.headers[StoreWaits.header] == "1")
        let later = waits.waitingCopy(of: Self.delivery(headers: [StoreWaits.header: String(StoreWaits.waitsPerTier)]))
        #expect(later.destination == .retry(delay: 15, lane: .urgent))
        #expect(later.properties.headers[StoreWaits.header] == String(StoreWaits.waitsPerTier + 1))
        #expect(StoreWaits.waits(of: Self.delivery(headers: [StoreWaits.header: "nonsense"])) == 0)
        // A publisher can set the header: the largest count it can write waits on, counted no further.
        let forged = waits.waitingCopy(of: Self.delivery(headers: [StoreWaits.header: String(Int.max)]))
        #expect(forged.properties.headers[StoreWaits.header] == "1000001")
    }

    @Test func aJobWaitsWhenOneOfItsUsersOrItsActivityIsUnavailable() throws {
        let job = try PushJob.decode(
            Array(W.job("j", users: ["alice", "bob"]).utf8), defaultTopic: W.topic, fallbackID: "f")
        let none = ResolvedUsers(tokens: [:])
        #expect(!StoreWaits.mustWait(job, users: none, activities: none))
        #expect(StoreWaits.mustWait(job, users: ResolvedUsers(tokens: [:], unavailable: ["bob"]), activities: none))
        #expect(!StoreWaits.mustWait(job, users: ResolvedUsers(tokens: [:], unavailable: ["carol"]), activities: none))
    }

    /// One user on a silent node: that job waits in the delay queue, whole and unchanged, and is acknowledged; the
    /// job of a user elsewhere is sent as usual. Nothing of the waiting job is sent, nothing removed.
    @Test func aJobWhoseUserIsOnASilentNodeWaitsWhileOthersAreSent() throws {
        let fleet = InMemoryFleet()
        fleet.change { state in
            state.cache = ["alice": W.cached(1), "bob": W.cached(2)]
            state.silentUsers = ["bob"]
        }
        let running = W.Running(fleet)
        let sent = fleet.deliver(W.job("to-alice", users: ["alice"]))
        let waiting = fleet.deliver(W.job("to-bob", users: ["bob"]))
        #expect(fleet.wait { $0.acknowledged.contains(sent) && $0.acknowledged.contains(waiting) })
        running.stop()
        let state = fleet.read { $0 }
        #expect(state.sent.map(\.token) == [W.token(1)], "only the reachable user's job was sent")
        let copy = try #require(state.published.first)
        #expect(state.published.count == 1 && copy.destination == .retry(delay: 1, lane: .urgent))
        #expect(
            copy.body == Array(W.job("to-bob", users: ["bob"]).utf8)
                && copy.properties.headers[StoreWaits.header] == "1")
        #expect(state.removals.isEmpty && state.requeued.isEmpty)
        #expect(running.worker.statistics.jobsWaiting.load(ordering: .relaxed) == 1)
        #expect(running.worker.metricsText.contains(#"apns_worker_jobs_total{result="waiting"} 1"#))
    }

    /// A redelivered job whose idempotency record is on a silent node: what it sent before is unknown, so it is not
    /// sent now; it waits.
    @Test func aRedeliveryWhoseRecordIsOnASilentNodeWaits() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.silentRecords = ["again"] }
        let running = W.Running(fleet)
        let tag = fleet.deliver(W.job("again", tokens: [W.token(5)]), redelivered: true)
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        let state = fleet.read { $0 }
        #expect(state.sent.isEmpty, "nothing sent while what the last delivery sent is unknown")
        #expect(state.published.map(\.destination) == [.retry(delay: 1, lane: .urgent)])
    }

    /// A large job (more users than a piece) with some users on a silent node: the others' notifications go out at
    /// once; the rest are asked for again and go out once the node answers; the job settles once, with nothing
    /// published.
    @Test func aLargeJobSendsTheReachableUsersAndTheRestOnceTheirNodeAnswers() throws {
        let fleet = InMemoryFleet()
        let users = (1...30).map { "user-\($0)" }
        fleet.change { state in
            for (index, user) in users.enumerated() { state.cache[user] = W.cached(index + 1) }
            state.silentUsers = ["user-3", "user-17"]
        }
        let running = W.Running(fleet, settings: W.settings(usersPerPiece: 10))
        let tag = fleet.deliver(W.job("large", users: users))
        #expect(fleet.wait { $0.sent.count == 28 }, "every reachable user's notification went out")
        #expect(fleet.read { !$0.acknowledged.contains(tag) }, "the job waits for its last two users")
        fleet.change { $0.silentUsers = [] }
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "settled once the node answers")
        running.stop()
        let state = fleet.read { $0 }
        #expect(state.sent.map(\.token).sorted() == (1...30).map(W.token), "every user's token, each once")
        #expect(state.published.isEmpty && state.acknowledged == [tag])
    }

    /// Outcomes whose record's node does not answer stay with the worker and are written once it answers: a
    /// redelivery of the job after that skips them.
    @Test func outcomesTheRecordCouldNotTakeAreWrittenOnceItAnswers() throws {
        let fleet = InMemoryFleet()
        fleet.change { state in
            state.silentRecords = ["held"]
            state.holdingAnswers = true
        }
        let running = W.Running(fleet)
        let tokens = (1...3).map(W.token)
        let body = W.job("held", tokens: tokens)
        fleet.deliver(body)
        #expect(fleet.wait { $0.sent.count == 3 })
        fleet.change { $0.brokerDown = true }
        fleet.brokerReadable.signal()
        #expect(fleet.wait { $0.sessionsLost == 1 }, "the session ended with the job unsettled")
        // APNs answers while the worker is away; the next session finds the answers and cannot write them.
        fleet.releaseAnswers()
        fleet.change { $0.brokerDown = false }
        #expect(fleet.wait { $0.unwrittenRecords > 0 }, "the record was tried")
        #expect(fleet.read { $0.settled["held"] == nil }, "and not written while its node is silent")
        fleet.change { $0.silentRecords = [] }
        let again = fleet.deliver(body, redelivered: true)
        #expect(fleet.wait { $0.acknowledged.contains(again) })
        running.stop()
        let state = fleet.read { $0 }
        #expect(state.settled["held"]?.tokens == Set(tokens), "written before the redelivery was looked up")
        #expect(state.sent.count == 3, "the redelivery sent nothing again")
    }
}
