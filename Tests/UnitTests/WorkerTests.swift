import APNs
import Foundation
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// The real `Worker` over in-memory ports: whole jobs from delivery to acknowledgement, with no process or socket.
@Suite struct WorkerTests {
    static let topic = "com.example.app"

    static func token(_ number: Int) -> String { String(format: "%064x", number) }

    static func settings(
        maximumInFlight: Int = 100, bulkJobsPerTurn: Int = 16, attempts: Int = 3,
        maximumDeliveries: Int = 5, guardThreshold: Int = 20, usersPerPiece: Int = 1000,
        bulkAdmission: BulkAdmission = BulkAdmission()
    ) -> WorkerSettings {
        WorkerSettings(
            core: WorkerCore.Settings(
                prefetch: 100, maximumNotificationsInFlight: maximumInFlight,
                shutdownTimeout: 5, bulkJobsPerTurn: bulkJobsPerTurn,
                sendBatchLimit: maximumInFlight, usersPerPiece: usersPerPiece,
                bulkAdmission: bulkAdmission),
            defaultTopic: topic, invalidationGuard: MassInvalidationGuard(threshold: guardThreshold),
            maximumSendAttempts: attempts, retryDelays: [1, 15, 60, 300], maximumDeliveries: maximumDeliveries)
    }

    /// A worker running on its own thread (its broker thread), as `apns-worker run` runs it.
    final class Running: @unchecked Sendable {
        let worker: Worker
        private let finished = DispatchSemaphore(value: 0)
        private let failure = Locked<(any Error)?>(nil)

        let sender: InMemorySender

        init(
            _ fleet: InMemoryFleet, settings: WorkerSettings = WorkerTests.settings(),
            answer: @escaping @Sendable (APNsNotification) -> APNsResponse = { _ in APNsResponse(status: 200) },
            broadcastAnswer: @escaping @Sendable (APNsBroadcast) -> APNsResponse = { _ in APNsResponse(status: 200) }
        ) {
            sender = InMemorySender(fleet, answer: answer, broadcastAnswer: broadcastAnswer)
            worker = Worker(
                settings: settings, sender: sender,
                logger: Logger(label: "worker-test", level: .critical)
            ) { try fleet.session() }
            Thread.detachNewThread { [self] in
                do { try worker.run() } catch { failure.withLock { $0 = error } }
                finished.signal()
            }
        }

        /// Stops the worker and waits for `run()` to return; fails the test if it does not within 10 s or threw.
        func stop() {
            worker.stop()
            #expect(finished.wait(timeout: .now() + 10) == .success, "run() returned after stop()")
            #expect(failure.withLock { $0 } == nil, "run() threw: \(String(describing: failure.withLock { $0 }))")
        }
    }

    static func job(_ id: String, users: [String] = [], tokens: [String] = []) -> String {
        let users = users.map { "\"\($0)\"" }.joined(separator: ",")
        let tokens = tokens.map { "\"\($0)\"" }.joined(separator: ",")
        return #"{"id":"\#(id)","topic":"\#(topic)","users":[\#(users)],"tokens":[\#(tokens)],"payload":{"aps":{}}}"#
    }

    static func cached(_ numbers: Int...) -> [CachedToken] {
        numbers.map { CachedToken(token: token($0), scope: TokenScope(environment: .production)) }
    }

    @Test func sendsAFanOutJobToEveryTokenOnceAndAcknowledgesItOnce() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.cache = ["alice": Self.cached(1, 2), "bob": Self.cached(3, 1)] }
        let running = Running(fleet)
        let tag = fleet.deliver(Self.job("fan-out", users: ["alice", "bob"], tokens: [Self.token(4)]))
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "the job was acknowledged")
        running.stop()
        let state = fleet.read { $0 }
        #expect(
            state.sent.map(\.token).sorted() == [1, 2, 3, 4].map(Self.token),
            "each token once, the one two users share included")
        #expect(state.acknowledged == [tag])
        #expect(state.published.isEmpty && state.removals.isEmpty && state.requeued.isEmpty)
    }

    /// What a worker sent with (a credential, here named by its topic, and an environment) goes to the fleet's store
    /// as it reports; a worker that starts later opens those connections before its first push.
    @Test func aStartingWorkerOpensTheConnectionsTheFleetSentWithLately() throws {
        let fleet = InMemoryFleet()
        fleet.change {
            $0.cache = ["alice": [CachedToken(token: Self.token(1), scope: TokenScope(environment: .sandbox))]]
        }
        let first = Running(fleet)
        let tag = fleet.deliver(Self.job("sandbox", users: ["alice"]))
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "the job was acknowledged")
        first.stop()
        let sandbox = SendingPool(credential: Self.topic, environment: .sandbox)
        #expect(fleet.read { $0.recentlySending } == [sandbox])
        #expect(fleet.read { $0.openedAhead }.isEmpty, "nothing had sent when the first worker started")
        let second = Running(fleet)
        #expect(fleet.wait { $0.openedAhead == [sandbox] }, "the second worker opened them as it started")
        second.stop()
    }

    @Test func a410RemovesOnlyTheTokenItNamesAndPublishesOneEvent() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.cache = ["alice": Self.cached(1, 2)] }
        let dead = Self.token(1)
        let running = Running(fleet) { notification in
            notification.deviceToken == dead
                ? APNsResponse(status: 410, reason: .unregistered, timestamp: 1_700_000_000_000)
                : APNsResponse(status: 200)
        }
        let tag = fleet.deliver(Self.job("one-dead", users: ["alice"]))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        let state = fleet.read { $0 }
        #expect(state.cache["alice"] == Self.cached(2), "only the dead token left the cache")
        #expect(state.published.count == 1)
        let event = try DeadTokenEvent.decode(try #require(state.published.first).body)
        #expect(state.published.first?.destination == .deadTokens)
        #expect(
            event.token == dead && event.user == "alice" && event.timestamp == 1_700_000_000_000
                && event.jobID == "one-dead")
    }

    @Test func schedulesARetryWithTheDelayAPNsAskedFor() throws {
        let fleet = InMemoryFleet()
        let busy = Self.token(7)
        let running = Running(fleet) { $0.deviceToken == busy ? APNsResponse(status: 503) : APNsResponse(status: 200) }
        let tag = fleet.deliver(Self.job("retried", tokens: [busy, Self.token(8)]))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        let published = fleet.read(\.published)
        #expect(
            published.map(\.destination) == [.retry(delay: 15, lane: .urgent)],
            "a 503 suggests 15 s, longer than the first tier's 1 s")
        let retry = try PushJob.decode(try #require(published.first).body, defaultTopic: nil, fallbackID: "-")
        #expect(retry.attempt == 2)
        #expect(retry.retryTargets?.map(\.token) == [busy], "only the notification that failed goes again")
    }

    @Test func parksAJobAfterItsLastAttemptWithItsOriginalBody() throws {
        let fleet = InMemoryFleet()
        let busy = Self.token(9)
        let running = Running(fleet, settings: Self.settings(attempts: 2)) { _ in APNsResponse(status: 503) }
        let original = Self.job("parked", tokens: [busy])
        let first = fleet.deliver(original)
        #expect(fleet.wait { $0.acknowledged.contains(first) && $0.published.count == 1 })
        // The delay queue hands the retry back as a job.
        let retryBody = String(decoding: fleet.read { $0.published[0].body }, as: UTF8.self)
        let second = fleet.deliver(retryBody)
        #expect(fleet.wait { $0.acknowledged.contains(second) })
        running.stop()
        let parked = try #require(fleet.read { $0.published.dropFirst().first })
        #expect(parked.destination == .failed)
        #expect(String(decoding: parked.body, as: UTF8.self) == original, "parked as its sender enqueued it")
        #expect(parked.properties.headers[Worker.attemptsHeader] == "2")
        #expect(parked.properties.headers[Worker.undeliveredHeader] == busy)
        #expect(
            parked.properties.headers[Worker.reasonHeader]?.hasPrefix(
                "1 of 1 notifications not delivered after 2 attempts") == true)
    }

    @Test func parksAPoisonJobUnreadAndSendsNothingOfIt() throws {
        let fleet = InMemoryFleet()
        let poison = MessageProperties(messageID: "poison-1", deliveryCount: 5)
        // The last worker that had it started it alone and never settled it: it died with it.
        fleet.change { _ = $0.alone.insert("id:poison-1") }
        let running = Running(fleet, settings: Self.settings(maximumDeliveries: 5))
        let tag = fleet.deliver(Self.job("poison", tokens: [Self.token(1)]), properties: poison, redelivered: true)
        let healthy = fleet.deliver(Self.job("healthy", tokens: [Self.token(2)]))
        #expect(fleet.wait { $0.acknowledged.contains(tag) && $0.acknowledged.contains(healthy) })
        running.stop()
        let state = fleet.read { $0 }
        #expect(state.sent.map(\.token) == [Self.token(2)], "nothing of the poison job was sent")
        let parked = try #require(state.published.first)
        #expect(state.published.count == 1 && parked.destination == .failed)
        #expect(
            parked.properties.headers[Worker.reasonHeader]?.hasPrefix("delivered 6 times, more than the 5 allowed")
                == true)
        #expect(running.worker.statistics.poisonJobs.load(ordering: .relaxed) == 1)
    }

    @Test func theGuardHoldsBackAMassInvalidation() throws {
        let fleet = InMemoryFleet()
        let users = (1...4).map { "user-\($0)" }
        fleet.change { state in for (index, user) in users.enumerated() { state.cache[user] = Self.cached(index + 1) } }
        let running = Running(fleet, settings: Self.settings(guardThreshold: 3)) { _ in
            APNsResponse(status: 400, reason: .badDeviceToken)
        }
        let tag = fleet.deliver(Self.job("wrong-environment", users: users))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        let state = fleet.read { $0 }
        #expect(state.removals.isEmpty && state.published.isEmpty, "no token removed, no event")
        #expect(users.allSatisfy { state.cache[$0]?.count == 1 })
        #expect(running.worker.statistics.heldBack.load(ordering: .relaxed) == 4)
        #expect(running.worker.statistics.invalidationGuardTrips.load(ordering: .relaxed) == 1)
    }

    @Test func sendsUrgentWorkBeforeABulkBacklog() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = Running(fleet, settings: Self.settings(maximumInFlight: 20))
        let bulk = fleet.deliver(Self.job("campaign", tokens: (1...200).map(Self.token)), lane: .bulk)
        #expect(fleet.wait { $0.sent.count == 20 }, "the bulk lane's window is full")
        let urgent = fleet.deliver(Self.job("urgent", tokens: (1001...1005).map(Self.token)))
        #expect(fleet.wait { $0.sent.filter { $0.lane == .urgent }.count == 5 }, "the urgent job went out")
        #expect(
            fleet.read { $0.sent.filter { $0.lane == .bulk }.count } == 20,
            "while 180 bulk notifications still waited")
        fleet.releaseAnswers()
        #expect(fleet.wait { $0.acknowledged.contains(bulk) && $0.acknowledged.contains(urgent) })
        running.stop()
        #expect(fleet.read { $0.acknowledged.first } == urgent, "the urgent job was settled first")
    }

    @Test func aStopGivesBackWorkNotStarted() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = Running(fleet, settings: Self.settings(maximumInFlight: 5, bulkJobsPerTurn: 1))
        let tags = (1...3).map { job in
            fleet.deliver(Self.job("bulk-\(job)", tokens: (1...20).map { Self.token(job * 100 + $0) }), lane: .bulk)
        }
        #expect(
            fleet.wait { $0.sent.count == 5 && $0.ready.isEmpty }, "the first bulk job is under way, all three read")
        running.worker.stop()
        #expect(fleet.wait { $0.requeued.count == 2 }, "the two bulk jobs not started went back")
        #expect(fleet.read(\.requeued).sorted() == Array(tags.dropFirst()))
        fleet.releaseAnswers()
        running.stop()
        #expect(fleet.read(\.acknowledged) == [tags[0]], "the job under way was finished")
    }
}
