import APNs
import Foundation
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// Large jobs are resolved and sent a piece at a time.
@Suite struct WorkerLargeJobTests {
    typealias Spec = WorkerTests

    /// A fleet whose cache holds `count` users named `prefix-N` with a token each, its answers held.
    private static func campaignWithAnswersHeld(_ prefix: String, users count: Int) -> (InMemoryFleet, [String]) {
        let fleet = InMemoryFleet()
        let users = (1...count).map { "\(prefix)-\($0)" }
        fleet.change { state in
            for (index, user) in users.enumerated() { state.cache[user] = Spec.cached(index + 1) }
            state.holdingAnswers = true
        }
        return (fleet, users)
    }

    @Test func aLargeJobGoesOutInPiecesEachTokenOnceAndSettlesOnce() throws {
        let fleet = InMemoryFleet()
        let users = (1...35).map { "fan-\($0)" }
        fleet.change { state in
            for (index, user) in users.enumerated() { state.cache[user] = Spec.cached(index + 1) }
            state.cache["fan-35"] = Spec.cached(35, 1)  // a device under two users, in different pieces
        }
        let dead = Spec.token(30)
        let running = Spec.Running(fleet, settings: Spec.settings(usersPerPiece: 10)) { notification in
            notification.deviceToken == dead
                ? APNsResponse(status: 410, reason: .unregistered) : APNsResponse(status: 200)
        }
        let tag = fleet.deliver(
            Spec.job("large", users: users, tokens: [Spec.token(99)]),
            properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        let state = fleet.read { $0 }
        #expect(state.resolutions == [10, 10, 10, 5], "a piece of users at a time: \(state.resolutions)")
        #expect(state.sent.map(\.token).sorted() == ((1...35).map(Spec.token) + [Spec.token(99)]).sorted(), "each once")
        #expect(state.acknowledged == [tag])
        let destinations = state.published.map(\.destination)
        #expect(
            destinations.filter { $0 == .deadTokens }.count == 1
                && destinations.filter { $0 == .reply("replies") }.count == 1)
        let summary = try #require(state.published.first { $0.destination == .reply("replies") })
        let text = String(decoding: summary.body, as: UTF8.self)
        #expect(
            text.contains("\"notifications\":36") && text.contains("\"delivered\":35") && text.contains("\"dead\":1"),
            "\(text)")
        #expect(state.cache["fan-30"] == [], "the dead token of a later piece left the cache")
    }

    /// The outcomes of a large job's pieces go to the idempotency record as each piece completes, not when the whole
    /// job settles: a worker that dies halfway through a campaign costs what was in flight, not the half it sent.
    @Test func aLargeJobsAnswersAreRecordedPieceByPiece() throws {
        let (fleet, users) = Self.campaignWithAnswersHeld("piece", users: 30)
        let running = Spec.Running(fleet, settings: Spec.settings(maximumInFlight: 10, usersPerPiece: 10))
        let tag = fleet.deliver(Spec.job("pieces", users: users), lane: .bulk)
        #expect(fleet.wait { $0.sent.count == 10 }, "the first piece went out")
        fleet.releaseHeldAnswers()
        #expect(fleet.wait { $0.sent.count == 20 }, "the second piece went out, its answers held")
        #expect(
            fleet.wait { $0.settled["pieces"]?.tokens == Set((1...10).map(Spec.token)) },
            "the first piece's answers recorded while the job is under way")
        #expect(fleet.read(\.acknowledged).isEmpty)
        fleet.releaseAnswers()
        #expect(fleet.wait { $0.acknowledged == [tag] })
        running.stop()
        #expect(fleet.read(\.sent).count == 30)
    }

    @Test func urgentJobsStartBetweenALargeJobsPieces() throws {
        let (fleet, users) = Self.campaignWithAnswersHeld("campaign", users: 100)
        let running = Spec.Running(fleet, settings: Spec.settings(maximumInFlight: 10, usersPerPiece: 10))
        let large = fleet.deliver(Spec.job("campaign", users: users), lane: .bulk)
        #expect(fleet.wait { $0.sent.count == 10 }, "the first piece went out")
        let urgent = fleet.deliver(Spec.job("urgent", tokens: [Spec.token(500)]))
        #expect(fleet.wait { $0.sent.contains { $0.token == Spec.token(500) } }, "the urgent job went out")
        #expect(fleet.read { $0.resolutions.reduce(0, +) } <= 30, "while most of the campaign was not even resolved")
        fleet.releaseAnswers()
        #expect(fleet.wait { Set($0.acknowledged) == [large, urgent] })
        running.stop()
        #expect(fleet.read(\.sent).count == 101)
    }

    /// Large bulk jobs beyond the admission's budget wait as delivered until the ones under way settle: two 30-user
    /// campaigns under a budget of 25 targets run one after the other, the second not even decoded while the first's
    /// answers are out.
    @Test func largeBulkJobsPastTheAdmissionBudgetWaitForTheOnesUnderWay() throws {
        let fleet = InMemoryFleet()
        let users = (1...60).map { "admitted-\($0)" }
        fleet.change { state in
            for (index, user) in users.enumerated() { state.cache[user] = Spec.cached(index + 1) }
            state.holdingAnswers = true
        }
        let running = Spec.Running(
            fleet,
            settings: Spec.settings(
                usersPerPiece: 10, bulkAdmission: BulkAdmission(maximumBytes: 1 << 20, maximumTargets: 25)))
        let first = fleet.deliver(Spec.job("first", users: Array(users[..<30])), lane: .bulk)
        let second = fleet.deliver(Spec.job("second", users: Array(users[30...])), lane: .bulk)
        let statistics = running.worker.statistics
        #expect(fleet.wait { $0.sent.count == 30 }, "the first campaign went out whole")
        #expect(
            fleet.wait { _ in statistics.bulkJobsAwaitingAdmission.load(ordering: .relaxed) == 1 },
            "the second waits for admission")
        #expect(fleet.read { $0.resolutions.reduce(0, +) } == 30, "none of the second's users were resolved")
        fleet.releaseAnswers()
        #expect(fleet.wait { Set($0.acknowledged) == [first, second] })
        running.stop()
        #expect(fleet.read(\.sent).count == 60)
        #expect(statistics.bulkJobsAwaitingAdmission.load(ordering: .relaxed) == 0)
    }

    @Test func urgentJobsGoOutWhileABulkJobsUsersAreBeingResolved() throws {
        let fleet = InMemoryFleet()
        let users = (1...5).map { "digest-\($0)" }
        fleet.change { state in
            for (index, user) in users.enumerated() { state.cache[user] = Spec.cached(index + 1) }
            state.holdingResolutions = true
        }
        let running = Spec.Running(fleet)
        let bulk = fleet.deliver(Spec.job("digest", users: users), lane: .bulk)
        #expect(fleet.wait { $0.resolutionsWaiting == 1 }, "the bulk job's users are being resolved (slowly)")
        let urgent = fleet.deliver(Spec.job("urgent", tokens: [Spec.token(500)]))
        #expect(fleet.wait { $0.acknowledged == [urgent] }, "the urgent job was sent and settled meanwhile")
        #expect(fleet.read { $0.sent.map(\.token) } == [Spec.token(500)])
        fleet.change { $0.holdingResolutions = false }
        #expect(fleet.wait { Set($0.acknowledged) == [bulk, urgent] })
        running.stop()
        #expect(fleet.read(\.sent).count == 6)
    }

    @Test func aStopGivesBackABulkJobWhoseUsersWereBeingResolved() throws {
        let fleet = InMemoryFleet()
        fleet.change { state in
            state.cache["reader"] = Spec.cached(1)
            state.holdingResolutions = true
        }
        let running = Spec.Running(fleet)
        let first = fleet.deliver(Spec.job("digest", users: ["reader"]), lane: .bulk)
        #expect(fleet.wait { $0.resolutionsWaiting == 1 }, "the first bulk job's users are being resolved")
        // Read while the first is being prepared: it waits its turn, unstarted.
        let second = fleet.deliver(Spec.job("digest-2", users: ["reader"]), lane: .bulk)
        #expect(fleet.wait { $0.ready.isEmpty }, "the second bulk job was read")
        running.worker.stop()
        #expect(fleet.wait { $0.requeued == [second] }, "the stop gave back the job waiting its turn at once")
        fleet.change { $0.holdingResolutions = false }
        running.stop()
        let state = fleet.read { $0 }
        #expect(
            state.requeued == [second, first] && state.sent.isEmpty && state.acknowledged.isEmpty,
            "the job being prepared given back too, once prepared: \(state.requeued), \(state.sent.count) sent")
        #expect(state.givenBack.count == 2, "both noted as given back by an orderly stop")
    }
}
