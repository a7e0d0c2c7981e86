import APNs
import Foundation
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// The mass-invalidation guard over whole jobs: only answers that judge a token count, and a wave spread over
/// one-user jobs is weighed across the fleet.
@Suite struct WorkerGuardTests {
    typealias Spec = WorkerTests

    static func mismatch(_ notification: APNsNotification) -> APNsResponse {
        APNsResponse(status: 400, reason: .badDeviceToken)
    }

    @Test func aWaveOverOneUserJobsRemovesLessThanTheThreshold() throws {
        let fleet = InMemoryFleet()
        let users = (1...60).map { "user-\($0)" }
        fleet.change { state in for (index, user) in users.enumerated() { state.cache[user] = Spec.cached(index + 1) } }
        let running = Spec.Running(fleet, settings: Spec.settings(guardThreshold: 20), answer: Self.mismatch)
        let tags = users.map { fleet.deliver(Spec.job("one-\($0)", users: [$0])) }
        #expect(fleet.wait { Set($0.acknowledged).isSuperset(of: tags) })
        running.stop()
        let state = fleet.read { $0 }
        #expect(
            state.published.count <= 19 && state.removals.count == state.published.count,
            "at most threshold - 1 removed: \(state.published.count)")
        #expect(users.filter { state.cache[$0]?.isEmpty == false }.count >= 41)
        #expect(state.invalidationWindow == InvalidationCounts(mismatches: 60, judged: 60))
        #expect(running.worker.statistics.fleetGuardTripped.load(ordering: .relaxed) == true)
        #expect(running.worker.statistics.invalidationGuardFleetTrips.load(ordering: .relaxed) == 1)
    }

    @Test func aGenuineBadTokenAmongHealthyAnswersIsRemoved() throws {
        let fleet = InMemoryFleet()
        fleet.change {
            $0.cache = ["alice": Spec.cached(1)]
            $0.invalidationWindow = InvalidationCounts(mismatches: 25, judged: 1000)
        }
        let running = Spec.Running(fleet, answer: Self.mismatch)
        let tag = fleet.deliver(Spec.job("one-bad", users: ["alice"]))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(fleet.read { $0.cache["alice"] } == [], "one mismatch in forty answers is a dead token")
        #expect(fleet.read { $0.published.count } == 1)
    }

    @Test func anUnreadableWindowRemovesNothing() throws {
        let fleet = InMemoryFleet()
        fleet.change {
            $0.cache = ["alice": Spec.cached(1)]
            $0.invalidationWindow = nil
        }
        let running = Spec.Running(fleet, answer: Self.mismatch)
        let tag = fleet.deliver(Spec.job("unknown-fleet", users: ["alice"]))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(fleet.read { $0.cache["alice"] } == Spec.cached(1) && fleet.read { $0.published.isEmpty })
    }

    /// 20 mismatches beside 200 retries judge as 20 of 20; beside 20 deliveries, 20 of 40: held back either way.
    @Test(arguments: [(429, "TooManyRequests", 200), (503, "ServiceUnavailable", 200), (200, "", 20)])
    func otherAnswersDoNotDiluteAJobsMismatches(status: Int, reason: String, others: Int) throws {
        let fleet = InMemoryFleet()
        let mismatched = Set((1...20).map(Spec.token))
        let running = Spec.Running(fleet, settings: Spec.settings(attempts: 1)) { notification in
            mismatched.contains(notification.deviceToken)
                ? APNsResponse(status: 400, reason: .badDeviceToken)
                : APNsResponse(status: status, reason: reason.isEmpty ? nil : APNsReason(reason))
        }
        let tag = fleet.deliver(Spec.job("misconfigured", tokens: (1...(20 + others)).map(Spec.token)))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(
            !fleet.read { $0.published.contains { $0.destination == .deadTokens } },
            "20 mismatches beside \(others) answers \(status): no dead-token event")
        #expect(running.worker.statistics.heldBack.load(ordering: .relaxed) == 20)
    }
}
