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

    static func settings(maximumInFlight: Int = 100, bulkJobsPerTurn: Int = 16, attempts: Int = 3,
                         maximumDeliveries: Int = 5, guardThreshold: Int = 20, usersPerPiece: Int = 1000,
                         bulkAdmission: BulkAdmission = BulkAdmission()) -> WorkerSettings {
        WorkerSettings(core: WorkerCore.Settings(prefetch: 100, maximumNotificationsInFlight: maximumInFlight,
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

        init(_ fleet: InMemoryFleet, settings: WorkerSettings = WorkerTests.settings(),
             answer: @escaping @Sendable (APNsNotification) -> APNsResponse = { _ in APNsResponse(status: 200) },
             broadcastAnswer: @escaping @Sendable (APNsBroadcast) -> APNsResponse = { _ in APNsResponse(status: 200) }) {
            sender = InMemorySender(fleet, answer: answer, broadcastAnswer: broadcastAnswer)
            worker = Worker(settings: settings, sender: sender,
                            logger: Logger(label: "worker-test", level: .critical)) { try fleet.session() }
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
        #expect(state.sent.map(\.token).sorted() == [1, 2, 3, 4].map(Self.token),
                "each token once, the one two users share included")
        #expect(state.acknowledged == [tag])
        #expect(state.published.isEmpty && state.removals.isEmpty && state.requeued.isEmpty)
    }

    /// What a worker sent with (a credential, here named by its topic, and an environment) goes to the fleet's store
    /// as it reports; a worker that starts later opens those connections before its first push.
    @Test func aStartingWorkerOpensTheConnectionsTheFleetSentWithLately() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.cache = ["alice": [CachedToken(token: Self.token(1), scope: TokenScope(environment: .sandbox))]] }
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
            notification.deviceToken == dead ? APNsResponse(status: 410, reason: .unregistered, timestamp: 1_700_000_000_000)
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
        #expect(event.token == dead && event.user == "alice" && event.timestamp == 1_700_000_000_000 && event.jobID == "one-dead")
    }

    @Test func schedulesARetryWithTheDelayAPNsAskedFor() throws {
        let fleet = InMemoryFleet()
        let busy = Self.token(7)
        let running = Running(fleet) { $0.deviceToken == busy ? APNsResponse(status: 503) : APNsResponse(status: 200) }
        let tag = fleet.deliver(Self.job("retried", tokens: [busy, Self.token(8)]))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        let published = fleet.read(\.published)
        #expect(published.map(\.destination) == [.retry(delay: 15, lane: .urgent)],
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
        #expect(parked.properties.headers[Worker.reasonHeader]?.hasPrefix("1 of 1 notifications not delivered after 2 attempts") == true)
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
        #expect(parked.properties.headers[Worker.reasonHeader]?.hasPrefix("delivered 6 times, more than the 5 allowed") == true)
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
        #expect(fleet.read { $0.sent.filter { $0.lane == .bulk }.count } == 20,
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
        #expect(fleet.wait { $0.sent.count == 5 && $0.ready.isEmpty }, "the first bulk job is under way, all three read")
        running.worker.stop()
        #expect(fleet.wait { $0.requeued.count == 2 }, "the two bulk jobs not started went back")
        #expect(fleet.read(\.requeued).sorted() == Array(tags.dropFirst()))
        fleet.releaseAnswers()
        running.stop()
        #expect(fleet.read(\.acknowledged) == [tags[0]], "the job under way was finished")
    }
}

/// `apns-worker jobs cancel`: what a cancelled job has not handed to APNs is not sent, and it settles as usual.
@Suite struct WorkerCancellationTests {
    typealias Spec = WorkerTests

    static func summary(_ fleet: InMemoryFleet) -> [String: Any]? {
        fleet.read { state in
            state.published.first { $0.destination == .reply("replies") }
                .flatMap { try? JSONSerialization.jsonObject(with: Data($0.body)) as? [String: Any] }
        }
    }

    /// Cancels `jobID` fleet-wide; returns whether a worker read the cancellations since (within the wait's timeout).
    static func cancel(_ jobID: String, in fleet: InMemoryFleet) -> Bool {
        let reads = fleet.read(\.cancellationReads)
        fleet.change { $0.cancelled.append(CancelledJob(jobID: jobID, at: Date().timeIntervalSince1970)) }
        return fleet.wait { $0.cancellationReads > reads + 1 }
    }

    /// Cancelled with 20 of its 200 notifications in flight: the other 180 are never sent, the 20 are answered, and
    /// the job is acknowledged with a summary that counts 180 cancelled.
    @Test func aJobCancelledMidwaySendsNothingMore() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = Spec.Running(fleet, settings: Spec.settings(maximumInFlight: 20))
        let tag = fleet.deliver(Spec.job("campaign", tokens: (1...200).map(Spec.token)),
                                properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.sent.count == 20 }, "the window is full")
        #expect(Self.cancel("campaign", in: fleet), "the worker read the cancellations again")
        fleet.releaseAnswers()
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "the job settled")
        running.stop()
        #expect(fleet.read { $0.sent.count } == 20, "nothing sent after the cancellation")
        let summary = try #require(Self.summary(fleet))
        #expect(summary["notifications"] as? Int == 200 && summary["delivered"] as? Int == 20
                && summary["cancelled"] as? Int == 180, "\(summary)")
        #expect(fleet.read { $0.published.map(\.destination) } == [.reply("replies")], "nothing parked or retried")
    }

    /// A job cancelled before it arrives sends nothing; a job of another id beside it is sent whole.
    @Test func aJobCancelledBeforeItArrivesSendsNothing() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.cancelled = [CancelledJob(jobID: "early", at: Date().timeIntervalSince1970)] }
        let running = Spec.Running(fleet, settings: Spec.settings())
        let cancelled = fleet.deliver(Spec.job("early", tokens: (1...5).map(Spec.token)),
                                      properties: MessageProperties(replyTo: "replies"))
        let other = fleet.deliver(Spec.job("other", tokens: [Spec.token(9)]))
        #expect(fleet.wait { $0.acknowledged.contains(cancelled) && $0.acknowledged.contains(other) })
        running.stop()
        #expect(fleet.read { $0.sent.map(\.token) } == [Spec.token(9)])
        #expect(Self.summary(fleet)?["cancelled"] as? Int == 5)
    }
}

/// A job's `local_window`: users outside their hours leave in a part that waits in the broker for their opening.
@Suite struct WorkerWindowTests {
    typealias Spec = WorkerTests

    /// A window of the two hours around now in UTC: a user in UTC is inside it, users six hours behind (their own
    /// zone, or the job's default zone) wait about five hours for it.
    static func windowedJob(_ id: String) -> (body: String, opening: Int64) {
        let now = Int(Date().timeIntervalSince1970)
        let minute = now / 60 % 1440
        let clock = { (minute: Int) in String(format: "%02d:%02d", (minute + 1440) % 1440 / 60, (minute + 1440) % 60) }
        let window = LocalWindow(start: (minute + 1440 - 60) % 1440, end: (minute + 60) % 1440)
        let opening = window.nextOpening(after: Date(timeIntervalSince1970: Double(now)), in: TimeZone(identifier: "Etc/GMT+6")!)
        let body = #"{"id":"\#(id)","topic":"\#(Spec.topic)","users":["inside","behind","zoneless"],"#
            + #""local_window":{"start":"\#(clock(minute - 60))","end":"\#(clock(minute + 60))"},"#
            + #""default_timezone":"Etc/GMT+6","payload":{"aps":{}}}"#
        return (body, opening)
    }

    static func prepare(_ fleet: InMemoryFleet) {
        fleet.change { state in
            state.cache = ["inside": Spec.cached(1), "behind": Spec.cached(2), "zoneless": Spec.cached(3)]
            state.timeZones = ["inside": "Etc/UTC", "behind": "Etc/GMT+6"]
        }
    }

    @Test func usersOutsideTheirHoursWaitInAPart() throws {
        let fleet = InMemoryFleet()
        Self.prepare(fleet)
        let running = Spec.Running(fleet, settings: Spec.settings())
        let (body, opening) = Self.windowedJob("windowed")
        let tag = fleet.deliver(body, properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "the job settled")
        running.stop()
        #expect(fleet.read(\.sent).map(\.token) == [Spec.token(1)], "only the user inside the window")
        let published = fleet.read(\.published)
        let part = try #require(published.first { if case .retry = $0.destination { true } else { false } }, "\(published)")
        let job = try PushJob.decode(part.body, defaultTopic: nil, fallbackID: "x")
        #expect(job.id == "windowed" && job.users == ["behind", "zoneless"] && job.sendAt == opening, "\(job)")
        let name = WindowSplit.Part(opensAt: opening, users: ["behind", "zoneless"], tokens: []).name
        #expect(part.properties.headers[Worker.windowPartHeader] == name && part.properties.replyTo == "replies")
        if case .retry(let delay, _) = part.destination {
            #expect(delay <= Double(opening) - Date().timeIntervalSince1970, "it waits no longer than its opening")
        }
        let summary = try #require(WorkerCancellationTests.summary(fleet))
        #expect(summary["delivered"] as? Int == 1 && summary["waiting_for_window"] as? Int == 2, "\(summary)")
    }

    /// A part published twice (its job's publications made again) starts once: the copy is acknowledged, nothing sent.
    @Test func aCopyOfAStartedPartSendsNothing() throws {
        let fleet = InMemoryFleet()
        Self.prepare(fleet)
        let running = Spec.Running(fleet, settings: Spec.settings())
        let due = Int64(Date().timeIntervalSince1970) - 1
        let part = WindowSplit.Part(opensAt: due, users: ["inside"], tokens: [])
        let body = try #require(WindowSplit.partBody(Array(Self.windowedJob("twice").body.utf8), users: part.users,
                                                     tokens: [], sendAt: due))
        let properties = MessageProperties(headers: [Worker.windowPartHeader: part.name])
        let first = fleet.deliver(String(decoding: body, as: UTF8.self), properties: properties)
        #expect(fleet.wait { $0.acknowledged.contains(first) })
        let copy = fleet.deliver(String(decoding: body, as: UTF8.self), properties: properties)
        #expect(fleet.wait { $0.acknowledged.contains(copy) })
        running.stop()
        #expect(fleet.read(\.sent).map(\.token) == [Spec.token(1)], "sent once")
    }

    /// Cancelled before it settled, a windowed job publishes no part: what waited counts as cancelled.
    @Test func aCancelledWindowedJobLeavesNothingWaiting() throws {
        let fleet = InMemoryFleet()
        Self.prepare(fleet)
        fleet.change { $0.holdingAnswers = true }
        let running = Spec.Running(fleet, settings: Spec.settings())
        let tag = fleet.deliver(Self.windowedJob("called-off").body, properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.sent.count == 1 }, "the user inside the window is being sent to")
        #expect(WorkerCancellationTests.cancel("called-off", in: fleet), "the worker read the cancellations again")
        fleet.releaseAnswers()
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "the job settled")
        running.stop()
        #expect(fleet.read { $0.published.map(\.destination) } == [.reply("replies")], "no part waits")
        let summary = try #require(WorkerCancellationTests.summary(fleet))
        #expect(summary["cancelled"] as? Int == 2 && summary["waiting_for_window"] as? Int == 0, "\(summary)")
    }
}

/// A job's summary (reply_to) goes out at most once.
@Suite struct WorkerSummaryTests {
    typealias Spec = WorkerTests

    /// A job whose dead-token event the broker did not take is held, its summary already out: neither publishing it
    /// again nor a redelivery (its worker stopped meanwhile) sends a second summary.
    @Test func aHeldJobsSummaryIsNotPublishedAgain() throws {
        let fleet = InMemoryFleet()
        let dead = Spec.token(1)
        fleet.change { $0.missingQueues = [.deadTokens] }
        var settings = Spec.settings()
        settings.core.shutdownTimeout = 0.2
        let answer: @Sendable (APNsNotification) -> APNsResponse = { _ in APNsResponse(status: 410, reason: .unregistered) }
        let first = Spec.Running(fleet, settings: settings, answer: answer)
        let body = Spec.job("held", tokens: [dead])
        let tag = fleet.deliver(body, properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.settled["held"]?.summarySent == true }, "held, with its summary recorded as sent")
        first.stop()
        #expect(!fleet.read(\.acknowledged).contains(tag), "held jobs stay unacknowledged")
        fleet.change { $0.missingQueues = [] }
        let second = Spec.Running(fleet, settings: settings, answer: answer)
        let again = fleet.deliver(body, properties: MessageProperties(replyTo: "replies"), redelivered: true)
        #expect(fleet.wait { $0.acknowledged.contains(again) })
        second.stop()
        let destinations = fleet.read { $0.published.map(\.destination) }
        #expect(destinations == [.reply("replies"), .deadTokens], "one summary, then the event: \(destinations)")
        #expect(fleet.read(\.sent).count == 1, "the token was not sent to again")
    }
}

/// Large jobs are resolved and sent a piece at a time.
@Suite struct WorkerLargeJobTests {
    typealias Spec = WorkerTests

    @Test func aLargeJobGoesOutInPiecesEachTokenOnceAndSettlesOnce() throws {
        let fleet = InMemoryFleet()
        let users = (1...35).map { "fan-\($0)" }
        fleet.change { state in
            for (index, user) in users.enumerated() { state.cache[user] = Spec.cached(index + 1) }
            state.cache["fan-35"] = Spec.cached(35, 1)  // a device under two users, in different pieces
        }
        let dead = Spec.token(30)
        let running = Spec.Running(fleet, settings: Spec.settings(usersPerPiece: 10)) { notification in
            notification.deviceToken == dead ? APNsResponse(status: 410, reason: .unregistered) : APNsResponse(status: 200)
        }
        let tag = fleet.deliver(Spec.job("large", users: users, tokens: [Spec.token(99)]),
                                properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        let state = fleet.read { $0 }
        #expect(state.resolutions == [10, 10, 10, 5], "a piece of users at a time: \(state.resolutions)")
        #expect(state.sent.map(\.token).sorted() == ((1...35).map(Spec.token) + [Spec.token(99)]).sorted(), "each once")
        #expect(state.acknowledged == [tag])
        let destinations = state.published.map(\.destination)
        #expect(destinations.filter { $0 == .deadTokens }.count == 1 && destinations.filter { $0 == .reply("replies") }.count == 1)
        let summary = try #require(state.published.first { $0.destination == .reply("replies") })
        let text = String(decoding: summary.body, as: UTF8.self)
        #expect(text.contains("\"notifications\":36") && text.contains("\"delivered\":35") && text.contains("\"dead\":1"), "\(text)")
        #expect(state.cache["fan-30"] == [], "the dead token of a later piece left the cache")
    }

    @Test func urgentJobsStartBetweenALargeJobsPieces() throws {
        let fleet = InMemoryFleet()
        let users = (1...100).map { "campaign-\($0)" }
        fleet.change { state in
            for (index, user) in users.enumerated() { state.cache[user] = Spec.cached(index + 1) }
            state.holdingAnswers = true
        }
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
        let running = Spec.Running(fleet, settings: Spec.settings(
            usersPerPiece: 10, bulkAdmission: BulkAdmission(maximumBytes: 1 << 20, maximumTargets: 25)))
        let first = fleet.deliver(Spec.job("first", users: Array(users[..<30])), lane: .bulk)
        let second = fleet.deliver(Spec.job("second", users: Array(users[30...])), lane: .bulk)
        let statistics = running.worker.statistics
        #expect(fleet.wait { $0.sent.count == 30 }, "the first campaign went out whole")
        #expect(fleet.wait { _ in statistics.bulkJobsAwaitingAdmission.load(ordering: .relaxed) == 1 }, "the second waits for admission")
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
        #expect(state.requeued == [second, first] && state.sent.isEmpty && state.acknowledged.isEmpty,
                "the job being prepared given back too, once prepared: \(state.requeued), \(state.sent.count) sent")
        #expect(state.givenBack.count == 2, "both noted as given back by an orderly stop")
    }
}

/// Copies of jobs a publisher made after a broker failover (`Worker.republishedHeader`) send nothing twice.
@Suite struct WorkerRepublishedTests {
    typealias Spec = WorkerTests
    static let copy = MessageProperties(replyTo: "replies", messageID: "dup", headers: [Worker.republishedHeader: "1"])

    @Test func aCopyOfASettledJobIsAcknowledgedWithoutSending() throws {
        let fleet = InMemoryFleet()
        let running = Spec.Running(fleet)
        let body = Spec.job("dup", tokens: [Spec.token(1), Spec.token(2)])
        let original = fleet.deliver(body, properties: MessageProperties(replyTo: "replies", messageID: "dup"))
        #expect(fleet.wait { $0.acknowledged.contains(original) })
        let copy = fleet.deliver(body, properties: Self.copy)
        #expect(fleet.wait { $0.acknowledged.contains(copy) })
        running.stop()
        #expect(fleet.read(\.sent).count == 2, "each notification once")
        #expect(fleet.read { $0.published.count } == 1, "one summary")
        #expect(running.worker.statistics.republishedCopiesSkipped.load(ordering: .relaxed) == 1)
    }

    @Test func aRedeliveryAfterABrokerLossSkipsWhatWasAnsweredBeforeIt() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = Spec.Running(fleet)
        let body = Spec.job("lost", tokens: [Spec.token(1)])
        fleet.deliver(body, properties: MessageProperties(messageID: "lost"))
        #expect(fleet.wait { $0.sent.count == 1 })
        fleet.change { $0.brokerDown = true }
        fleet.brokerReadable.signal()
        #expect(fleet.wait { $0.sessionsLost == 1 }, "the session ended")
        // While the worker is away: APNs answers the notification, and the broker redelivers the job. The next
        // session reads the redelivery in the same turn as it finds the answer waiting.
        fleet.releaseAnswers()
        let redelivery = fleet.deliver(body, properties: MessageProperties(messageID: "lost"), redelivered: true)
        fleet.change { $0.brokerDown = false }
        #expect(fleet.wait { $0.acknowledged.contains(redelivery) })
        running.stop()
        #expect(fleet.read(\.sent).count == 1, "the answered notification is not sent again")
    }

    @Test func aCopyReadWithItsOriginalWaitsForIt() throws {
        let fleet = InMemoryFleet()
        let body = Spec.job("dup", tokens: [Spec.token(1)])
        // Both in the broker before the worker reads: they arrive in one batch.
        let original = fleet.deliver(body, properties: MessageProperties(replyTo: "replies", messageID: "dup"))
        let copy = fleet.deliver(body, properties: Self.copy)
        let running = Spec.Running(fleet)
        #expect(fleet.wait { Set($0.acknowledged) == [original, copy] })
        running.stop()
        #expect(fleet.read(\.sent).count == 1, "sent once")
        #expect(fleet.read { $0.published.count } == 1, "one summary")
    }
}

/// Suspects (jobs that came back twice unsettled) over whole jobs.
@Suite struct WorkerSuspectTests {
    typealias Spec = WorkerTests

    @Test func aBulkSuspectRunsAloneWhileUrgentJobsKeepFlowing() throws {
        let fleet = InMemoryFleet()
        fleet.change { state in
            state.holdingAnswers = true
            // Its third delivery, and the worker that last ran it died with it (its running mark is still there).
            state.running.insert("id:campaign")
        }
        let running = Spec.Running(fleet)
        let suspect = fleet.deliver(Spec.job("campaign", tokens: [Spec.token(1)]), lane: .bulk,
                                    properties: MessageProperties(messageID: "campaign", deliveryCount: 2), redelivered: true)
        #expect(fleet.wait { $0.startedAlone == ["id:campaign"] && $0.sent.count == 1 }, "the suspect runs alone")
        let bulk = fleet.deliver(Spec.job("next-campaign", tokens: [Spec.token(2)]), lane: .bulk)
        let urgent = fleet.deliver(Spec.job("urgent", tokens: [Spec.token(3)]))
        #expect(fleet.wait { $0.sent.contains { $0.token == Spec.token(3) } }, "the urgent job went out meanwhile")
        #expect(!fleet.read { $0.sent.contains { $0.token == Spec.token(2) } }, "the other bulk job waits behind it")
        fleet.releaseAnswers()
        #expect(fleet.wait { Set($0.acknowledged) == [suspect, bulk, urgent] })
        running.stop()
        #expect(fleet.read(\.alone).isEmpty, "its mark went once it settled")
    }

    /// A third delivery that no worker died running (its earlier deliveries were lost in transit with a connection,
    /// or handed back) runs as usual; once started it carries a running mark until it settles.
    @Test func deliveriesNoWorkerDiedRunningMakeNoSuspect() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = Spec.Running(fleet)
        let tag = fleet.deliver(Spec.job("lost-twice", tokens: [Spec.token(1)]),
                                properties: MessageProperties(messageID: "lost-twice", deliveryCount: 2), redelivered: true)
        #expect(fleet.wait { $0.sent.count == 1 && $0.running == ["id:lost-twice"] }, "sent at once, marked while it runs")
        fleet.releaseAnswers()
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(fleet.read(\.startedAlone).isEmpty, "not run alone")
        #expect(fleet.read(\.running).isEmpty, "its mark went once it settled")
    }

    @Test func deliveriesGivenBackByAnOrderlyStopMakeNoSuspect() throws {
        let fleet = InMemoryFleet()
        // Third delivery, but two rolling restarts gave it back: it is an ordinary job.
        fleet.change { $0.givenBack["id:restarted"] = 2 }
        let running = Spec.Running(fleet)
        let tag = fleet.deliver(Spec.job("restarted", tokens: [Spec.token(1)]),
                                properties: MessageProperties(messageID: "restarted", deliveryCount: 2), redelivered: true)
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(fleet.read(\.startedAlone).isEmpty, "not run alone")
    }

    @Test func aStopNotesWhatItGivesBack() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = Spec.Running(fleet, settings: Spec.settings(maximumInFlight: 5, bulkJobsPerTurn: 1))
        let tags = (1...2).map { job in
            fleet.deliver(Spec.job("given-\(job)", tokens: (1...20).map { Spec.token(job * 100 + $0) }), lane: .bulk,
                          properties: MessageProperties(messageID: "given-\(job)"))
        }
        #expect(fleet.wait { $0.sent.count == 5 && $0.ready.isEmpty })
        running.worker.stop()
        #expect(fleet.wait { $0.requeued == [tags[1]] })
        #expect(fleet.read(\.givenBack) == ["id:given-2": 1], "the unstarted job is noted as given back")
        fleet.releaseAnswers()
        running.stop()
    }
}

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
        #expect(state.published.count <= 19 && state.removals.count == state.published.count,
                "at most threshold - 1 removed: \(state.published.count)")
        #expect(users.filter { state.cache[$0]?.isEmpty == false }.count >= 41)
        #expect(state.invalidationWindow == InvalidationCounts(mismatches: 60, judged: 60))
        #expect(running.worker.statistics.fleetGuardTripped.load(ordering: .relaxed) == true)
        #expect(running.worker.statistics.invalidationGuardFleetTrips.load(ordering: .relaxed) == 1)
    }

    @Test func aGenuineBadTokenAmongHealthyAnswersIsRemoved() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.cache = ["alice": Spec.cached(1)]; $0.invalidationWindow = InvalidationCounts(mismatches: 25, judged: 1000) }
        let running = Spec.Running(fleet, answer: Self.mismatch)
        let tag = fleet.deliver(Spec.job("one-bad", users: ["alice"]))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(fleet.read { $0.cache["alice"] } == [], "one mismatch in forty answers is a dead token")
        #expect(fleet.read { $0.published.count } == 1)
    }

    @Test func anUnreadableWindowRemovesNothing() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.cache = ["alice": Spec.cached(1)]; $0.invalidationWindow = nil }
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
            mismatched.contains(notification.deviceToken) ? APNsResponse(status: 400, reason: .badDeviceToken)
                : APNsResponse(status: status, reason: reason.isEmpty ? nil : APNsReason(reason))
        }
        let tag = fleet.deliver(Spec.job("misconfigured", tokens: (1...(20 + others)).map(Spec.token)))
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(!fleet.read { $0.published.contains { $0.destination == .deadTokens } },
                "20 mismatches beside \(others) answers \(status): no dead-token event")
        #expect(running.worker.statistics.heldBack.load(ordering: .relaxed) == 20)
    }
}
