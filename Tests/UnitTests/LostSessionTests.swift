import APNs
import Foundation
import Telemetry
import Testing
import WorkerPipeline

/// A session lost while the worker lives (the broker's connection dropped, or closed by the broker for its consumer
/// timeout): what it held goes back to the broker, noted as handed back by a worker that did not die, and its answers
/// go to the idempotency record.
@Suite struct LostSessionTests {
    typealias W = WorkerTests

    /// Two deliveries under way when the broker connection drops: both are noted as handed back, and when the broker
    /// delivers them again (their third delivery by its count) they run as usual, not alone as suspects.
    @Test func deliveriesHandedBackByALostSessionMakeNoSuspect() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = W.Running(fleet)
        let bodies = (1...2).map { W.job("lost-\($0)", tokens: [W.token($0)]) }
        for (index, body) in bodies.enumerated() {
            fleet.deliver(
                body, properties: MessageProperties(messageID: "lost-\(index + 1)", deliveryCount: 1),
                redelivered: true)
        }
        #expect(fleet.wait { $0.sent.count == 2 })
        fleet.change { $0.brokerDown = true }
        fleet.brokerReadable.signal()
        #expect(fleet.wait { $0.sessionsLost == 1 })
        #expect(fleet.wait { $0.givenBack == ["id:lost-1": 1, "id:lost-2": 1] }, "both noted as handed back")
        fleet.change { state in
            state.brokerDown = false
            state.holdingAnswers = false
            state.heldAnswers.removeAll()
        }
        let again = bodies.enumerated().map { index, body in
            fleet.deliver(
                body, properties: MessageProperties(messageID: "lost-\(index + 1)", deliveryCount: 2),
                redelivered: true)
        }
        #expect(fleet.wait { Set(again).isSubset(of: $0.acknowledged) })
        running.stop()
        #expect(fleet.read(\.startedAlone).isEmpty, "no job ran alone")
        #expect(running.worker.statistics.suspectJobs.load(ordering: .relaxed) == 0)
    }

    /// The answers of a job completed on the lost connection go to the idempotency record at once, before the worker
    /// reconnects: a redelivery taken by another worker skips them.
    @Test func answersOfALostSessionAreRecordedBeforeItReconnects() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = W.Running(fleet)
        let tokens = (1...3).map(W.token)
        fleet.deliver(W.job("answered", tokens: tokens))
        #expect(fleet.wait { $0.sent.count == 3 })
        // The answers are in, the job not settled yet, when the connection drops; the broker stays away.
        fleet.change { $0.brokerDown = true }
        fleet.releaseAnswers()
        fleet.brokerReadable.signal()
        #expect(fleet.wait { $0.sessionsLost >= 1 })
        #expect(fleet.wait { $0.settled["answered"]?.tokens == Set(tokens) }, "recorded while the broker is away")
        fleet.change { $0.brokerDown = false }
        running.stop()
    }

    /// A job a worker settled whose acknowledgement was lost with its connection comes back redelivered: the fleet's
    /// record of settled jobs says so, and it is acknowledged without sending anything.
    @Test func aRedeliveryOfAJobTheFleetSettledSendsNothing() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.settledRecently = ["acked-then-lost"] }
        let running = W.Running(fleet)
        let again = fleet.deliver(W.job("acked-then-lost", tokens: [W.token(1)]), redelivered: true)
        let other = fleet.deliver(W.job("redelivered-unsettled", tokens: [W.token(2)]), redelivered: true)
        #expect(fleet.wait { Set([again, other]).isSubset(of: $0.acknowledged) })
        running.stop()
        #expect(fleet.read(\.sent).map(\.token) == [W.token(2)], "only the job no worker settled was sent")
    }

    /// The connection drops while a finished job's dead-token event waits for its confirm: the job goes back to the
    /// broker unacknowledged, and its answers go to the idempotency record first (a redelivery then sends nothing
    /// again and still publishes the event).
    @Test func answersOfJobsWhoseSettlingLostTheConnectionAreRecorded() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.publishesLoseTheConnection = true }
        let dead = W.token(1)
        let live = W.token(2)
        let running = W.Running(fleet) { notification in
            notification.deviceToken == dead
                ? APNsResponse(status: 410, reason: .unregistered, timestamp: 1_700_000_000_000)
                : APNsResponse(status: 200)
        }
        fleet.deliver(W.job("settling", tokens: [dead, live]))
        #expect(fleet.wait { $0.settled["settling"]?.tokens == [dead, live] }, "both answers recorded")
        fleet.change { $0.publishesLoseTheConnection = false }
        running.stop()
        #expect(fleet.read(\.acknowledged).isEmpty, "not acknowledged: the broker redelivers it")
        #expect(fleet.read(\.settled)["settling"]?.dead.map(\.target.token) == [dead], "with what the event needs")
    }

    /// Redis is lost while a finished job's dead token is taken out of the cache: the token's event is out, so the
    /// job is acknowledged all the same (the cleanup consumer removes the token), rather than handed back to another
    /// worker that could not know its notifications were sent.
    /// Also when the broker held its acknowledgement back (to go with an older delivery's): it goes out before the
    /// session ends, not with the connection.
    @Test(arguments: [nil, 60] as [Double?])
    func aJobWhoseDeadTokenRemovalLosesTheStoreIsAcknowledged(acknowledgementHold: Double?) throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.acknowledgementHold = acknowledgementHold }
        let dead = W.token(1)
        let live = W.token(2)
        let scope = TokenScope(environment: .production)
        fleet.change { state in
            state.removalsLoseTheStore = true
            state.cache["alice"] = [CachedToken(token: dead, scope: scope), CachedToken(token: live, scope: scope)]
        }
        let running = W.Running(fleet) { notification in
            notification.deviceToken == dead
                ? APNsResponse(status: 410, reason: .unregistered, timestamp: 1_700_000_000_000)
                : APNsResponse(status: 200)
        }
        let tag = fleet.deliver(W.job("removal-lost", users: ["alice"]))
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "acknowledged though its dead token stayed")
        fleet.change { $0.removalsLoseTheStore = false }
        running.stop()
        #expect(fleet.read(\.published).map(\.destination) == [.deadTokens], "the token's event")
        #expect(fleet.read(\.cache)["alice"]?.count == 2, "the cleanup consumer removes the token")
        #expect(fleet.read(\.sent).count == 2, "each notification sent once")
        #expect(running.worker.statistics.storeUnavailableCount("token_removal") == 1)
    }
}
