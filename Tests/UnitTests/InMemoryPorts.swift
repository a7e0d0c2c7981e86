import APNs
import Foundation
import Telemetry
import Threads
import WorkerPipeline

/// The pipeline's ports in memory, for running the real `Worker` with no process or socket. Every port writes into one
/// `InMemoryFleet`, whose state a test reads and waits on: each change wakes the waiters, so a test waits for what it
/// expects (with a timeout) rather than for time to pass.
final class InMemoryFleet: @unchecked Sendable {
    /// What the ports saw and hold. Guarded by `condition`.
    struct State {
        // Broker
        var ready: [JobDelivery] = []
        var nextTag: UInt64 = 1
        var acknowledged: [UInt64] = []
        /// How long the broker holds acknowledgements back (nil: not at all), as `AMQPJobBroker` does when an older
        /// delivery is under way, and those it holds with when they are due.
        var acknowledgementHold: TimeInterval?
        var heldAcknowledgements: [(tag: UInt64, due: Date)] = []
        var requeued: [UInt64] = []
        var published: [Publication] = []
        /// Destinations whose publications the broker hands back (their queue was deleted).
        var missingQueues: Set<Publication.Destination> = []
        /// While true, the broker is gone: a session's next read fails and no new session connects.
        var brokerDown = false
        /// Reads that failed because the broker was down (sessions lost).
        var sessionsLost = 0
        /// While true, a publish loses the broker connection.
        var publishesLoseTheConnection = false
        // Store
        var cache: [String: [CachedToken]] = [:]
        /// Parts of windowed jobs and scheduled jobs that started (`RecentlySettledJobs.claimWindowParts`,
        /// `claimScheduledStarts`).
        var claimedParts: Set<String> = []
        /// Users' registered time zones (`TokenStore.timeZones`).
        var timeZones: [String: String] = [:]
        /// Live Activities' update tokens, by activity id.
        var activities: [String: [CachedToken]] = [:]
        var removals: [TokenRemoval] = []
        /// While true, taking tokens out loses the store's connection.
        var removalsLoseTheStore = false
        /// How many users each resolution asked for, in order.
        var resolutions: [Int] = []
        /// While true, resolutions wait (a slow token cache); `resolutionsWaiting` counts those waiting now.
        var holdingResolutions = false
        var resolutionsWaiting = 0
        var settled: [String: Settled] = [:]
        /// Users, and jobs' idempotency records, on a Redis node that does not answer (a cluster master lost).
        var silentUsers: Set<String> = []
        var silentRecords: Set<String> = []
        /// Writes to the idempotency record that met a silent node.
        var unwrittenRecords = 0
        var redeliveries: [String: Int] = [:]
        var alone: Set<String> = []
        /// History keys of redelivered jobs a worker runs (`markRunning`), until they settle or are handed back.
        var running: Set<String> = []
        var givenBack: [String: Int] = [:]
        var settledRecently: Set<String> = []
        /// Every history key a worker marked as running alone, in order.
        var startedAlone: [String] = []
        var reports = 0
        /// The pools the fleet's workers reported sending with (no clock: a test starts it where it wants).
        var recentlySending: Set<SendingPool> = []
        /// The pools workers were asked to open ahead of their first push, in order.
        var openedAhead: [SendingPool] = []
        /// The fleet's window of token-judging answers; nil makes the store refuse it.
        var invalidationWindow: InvalidationCounts? = InvalidationCounts()
        /// The fleet's cancelled jobs (`apns-worker jobs cancel`), and how often workers asked for them.
        var cancelled: [CancelledJob] = []
        var cancellationReads = 0
        // Sender
        var sent: [(lane: JobLane, token: String)] = []
        /// Broadcasts sent, by channel id, in order.
        var broadcastsSent: [String] = []
        var holdingAnswers = false
        var heldAnswers: [() -> Void] = []
    }

    private let condition = NSCondition()
    private var state = State()
    /// The broker's socket: readable when deliveries are waiting.
    let brokerReadable = Wakeup()

    func read<T>(_ body: (State) -> T) -> T {
        condition.lock()
        defer { condition.unlock() }
        return body(state)
    }

    func change<T, Failure: Error>(_ body: (inout State) throws(Failure) -> T) throws(Failure) -> T {
        condition.lock()
        defer {
            condition.broadcast()
            condition.unlock()
        }
        return try body(&state)
    }

    /// Blocks the caller while the fleet holds resolutions, counted in `resolutionsWaiting`.
    func passResolutionHold() {
        condition.lock()
        defer { condition.unlock() }
        guard state.holdingResolutions else { return }
        state.resolutionsWaiting += 1
        condition.broadcast()
        while state.holdingResolutions { condition.wait() }
        state.resolutionsWaiting -= 1
        condition.broadcast()
    }

    /// Waits until `predicate` holds, at most `timeout` seconds; returns whether it holds.
    func wait(timeout: Double = 10, until predicate: (State) -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while !predicate(state) {
            guard condition.wait(until: deadline) else { return predicate(state) }
        }
        return true
    }

    /// Puts a job on the broker; returns its delivery tag.
    @discardableResult
    func deliver(
        _ json: String, lane: JobLane = .urgent, properties: MessageProperties = MessageProperties(),
        redelivered: Bool = false
    ) -> UInt64 {
        let tag = change { state in
            defer { state.nextTag += 1 }
            state.ready.append(
                JobDelivery(
                    tag: state.nextTag, redelivered: redelivered, body: Array(json.utf8),
                    properties: properties, lane: lane))
            return state.nextTag
        }
        brokerReadable.signal()
        return tag
    }

    struct BrokerDown: Error {}

    struct StoreLost: SystemFailure {
        var failedSystem: ConnectionRefused.System { .store }
    }

    func session() throws -> WorkerSession {
        guard !read(\.brokerDown) else { throw BrokerDown() }
        return WorkerSession(
            broker: InMemoryBroker(self), tokens: InMemoryTokenStore(self),
            preparationTokens: InMemoryTokenStore(self), preparationRecord: InMemoryRecord(self),
            record: InMemoryRecord(self),
            statistics: InMemoryStatistics(self), rateLimiter: InMemoryRateLimiter(),
            invalidationWindow: InMemoryInvalidationWindow(self), store: InMemoryBroker(self), logMetadata: [:],
            cancellations: InMemoryCancellations(self))
    }

    /// Answers held back by the sender so far go out now, in the order sent; those of notifications sent from now on
    /// are held in turn.
    func releaseHeldAnswers() {
        let held = change { state in
            defer { state.heldAnswers.removeAll() }
            return state.heldAnswers
        }
        for answer in held { answer() }
    }

    /// Answers held back by the sender go out now, and from then on answers go out at once. What was held is answered
    /// in the order sent, before anything sent meanwhile (held in turn until the held ones are out): as a server answers
    /// in order, a later notification is never answered ahead of one held before it.
    func releaseAnswers() {
        while true {
            let held = change { state in
                if state.heldAnswers.isEmpty { state.holdingAnswers = false }
                defer { state.heldAnswers.removeAll() }
                return state.heldAnswers
            }
            if held.isEmpty { return }
            for answer in held { answer() }
        }
    }
}

final class InMemoryBroker: JobBroker {
    private let fleet: InMemoryFleet

    /// A new session's broker: what the last one held back unacknowledged went with its connection.
    init(_ fleet: InMemoryFleet) {
        self.fleet = fleet
        fleet.change { $0.heldAcknowledgements.removeAll() }
    }

    func receive(limit: Int) throws -> [BrokerNotice] {
        fleet.brokerReadable.acknowledge()
        return try fleet.change { state in
            if state.brokerDown {
                state.sessionsLost += 1
                throw InMemoryFleet.BrokerDown()
            }
            let taken = state.ready.prefix(limit)
            state.ready.removeFirst(taken.count)
            return taken.map { .delivery($0) }
        }
    }

    var hasBufferedInput: Bool { fleet.read { !$0.ready.isEmpty } }
    var readableDescriptor: Int32 { fleet.brokerReadable.fileDescriptor }

    func publish(_ publications: [Publication]) throws -> [PublicationOutcome] {
        try fleet.change { state in
            // The connection drops while the worker waits for the confirms.
            if state.publishesLoseTheConnection { throw InMemoryFleet.BrokerDown() }
            return publications.map { publication in
                guard !state.missingQueues.contains(publication.destination) else { return .noQueue }
                state.published.append(publication)
                return .taken
            }
        }
    }

    func acknowledge(_ tags: [UInt64]) throws {
        let held = fleet.change { state -> Bool in
            guard let hold = state.acknowledgementHold else {
                state.acknowledged += tags
                return false
            }
            state.heldAcknowledgements += tags.map { ($0, Date().addingTimeInterval(hold)) }
            return true
        }
        if !held && !tags.isEmpty { acknowledgementFrames.multiple += 1 }
    }
    var acknowledgementsDue: Date? { fleet.read { $0.heldAcknowledgements.map(\.due).min() } }
    /// Counted as the AMQP adapter sends them: a multiple frame for a call acknowledged at once, a single one for
    /// each held acknowledgement once it goes.
    private var acknowledgementFrames = AcknowledgementFrames()
    func takeAcknowledgementFrames() -> AcknowledgementFrames {
        defer { acknowledgementFrames = AcknowledgementFrames() }
        return acknowledgementFrames
    }
    func acknowledgeHeld(dueBy now: Date) throws {
        let sent = fleet.change { state -> Int in
            let due = state.heldAcknowledgements.filter { $0.due <= now }.map(\.tag)
            state.acknowledged += due
            state.heldAcknowledgements.removeAll { $0.due <= now }
            return due.count
        }
        acknowledgementFrames.single += sent
    }
    func requeue(_ tag: UInt64) throws { fleet.change { $0.requeued.append(tag) } }
    func probe() throws {}
    func laneQueues() throws -> LaneQueues {
        fleet.read { LaneQueues(messages: LaneCounts(urgent: $0.ready.count), consumers: LaneCounts(urgent: 1)) }
    }
    func close() { try? acknowledgeHeld(dueBy: .distantFuture) }
    var logMetadata: [String: String] { [:] }
}

final class InMemoryTokenStore: TokenStore {
    private let fleet: InMemoryFleet

    init(_ fleet: InMemoryFleet) { self.fleet = fleet }

    func resolveActivities(_ activities: [String]) throws -> ResolvedUsers {
        let wanted = Set(activities)
        return fleet.read { state in
            ResolvedUsers(tokens: ResolvedTokens(state.activities.filter { wanted.contains($0.key) }))
        }
    }

    func resolve(_ users: [String]) throws -> ResolvedUsers {
        fleet.passResolutionHold()
        let wanted = Set(users)
        return fleet.change { state in
            state.resolutions.append(users.count)
            let silent = wanted.intersection(state.silentUsers)
            return ResolvedUsers(
                tokens: ResolvedTokens(state.cache.filter { wanted.contains($0.key) && !silent.contains($0.key) }),
                unavailable: silent)
        }
    }

    func timeZones(of users: [String]) throws -> (zones: [String: String], unavailable: Set<String>) {
        let wanted = Set(users)
        return fleet.read { state in
            (state.timeZones.filter { wanted.contains($0.key) }, wanted.intersection(state.silentUsers))
        }
    }

    /// As the Redis store does: a token goes only if its entry still serves what the removal names.
    func remove(_ removals: [TokenRemoval]) throws -> [CacheChange] {
        try fleet.change { state in
            if state.removalsLoseTheStore { throw InMemoryFleet.StoreLost() }
            return removals.map { removal in
                if state.silentUsers.contains(removal.user) { return .unavailable }
                state.removals.append(removal)
                if let activity = removal.activity {
                    let before = state.activities[activity]?.count ?? 0
                    state.activities[activity]?.removeAll { $0.token == removal.token }
                    return (state.activities[activity]?.count ?? 0) < before ? .applied : .unchanged
                }
                let before = state.cache[removal.user]?.count ?? 0
                state.cache[removal.user]?.removeAll { cached in
                    cached.token == removal.token
                        && (removal.onlyIfValueIn.map { $0.contains(cached.scope.cacheValue) } ?? true)
                }
                return (state.cache[removal.user]?.count ?? 0) < before ? .applied : .unchanged
            }
        }
    }
}

final class InMemoryRecord: IdempotencyRecord {
    private let fleet: InMemoryFleet

    init(_ fleet: InMemoryFleet) { self.fleet = fleet }

    func record(_ batches: [(jobID: String, outcomes: [SettledOutcome])]) throws -> RecordWrite {
        fleet.change { state in
            var written = RecordWrite()
            for (jobID, outcomes) in batches {
                if state.silentRecords.contains(jobID) {
                    written.unavailable.insert(jobID)
                    state.unwrittenRecords += 1
                    continue
                }
                var settled = state.settled[jobID] ?? Settled()
                for outcome in outcomes { settled.add(outcome) }
                state.settled[jobID] = settled
            }
            return written
        }
    }

    func settled(jobIDs: [String]) throws -> SettledLookup {
        fleet.read { state in
            let silent = state.silentRecords.intersection(jobIDs)
            return SettledLookup(
                settled: state.settled.filter { jobIDs.contains($0.key) && !silent.contains($0.key) },
                unavailable: silent)
        }
    }

    func countRedeliveries(of keys: [String]) throws -> (counts: [String: Int], unreadable: [String: String]) {
        fleet.change { state in
            var counts: [String: Int] = [:]
            for key in keys {
                state.redeliveries[key, default: 0] += 1
                counts[key] = state.redeliveries[key]
            }
            return (counts, [:])
        }
    }

    func startingAlone(_ key: String) throws {
        fleet.change { state in
            state.alone.insert(key)
            state.startedAlone.append(key)
        }
    }
    func settledAlone(_ key: String) throws { fleet.change { _ = $0.alone.remove(key) } }
    func markRunning(_ keys: [String]) throws { fleet.change { $0.running.formUnion(keys) } }
    func clearRunning(_ keys: [String]) throws { fleet.change { $0.running.subtract(keys) } }
    func ranAndDied(_ keys: [String]) throws -> Set<String> { fleet.read { $0.running.intersection(keys) } }
    func forget(_ key: String) throws { fleet.change { _ = $0.redeliveries.removeValue(forKey: key) } }
    func diedAlone(_ keys: [String]) throws -> Set<String> { fleet.read { $0.alone.intersection(keys) } }
    func gaveBack(_ keys: [String]) throws {
        fleet.change { state in
            for key in keys { state.givenBack[key, default: 0] += 1 }
            state.running.subtract(keys)
        }
    }
    func givenBack(_ keys: [String]) throws -> [String: Int] {
        fleet.read { $0.givenBack.filter { keys.contains($0.key) } }
    }
    func settledRecently(_ jobIDs: [String]) throws { fleet.change { $0.settledRecently.formUnion(jobIDs) } }
    func recentlySettled(_ jobIDs: [String]) throws -> Set<String> {
        fleet.read { $0.settledRecently.intersection(jobIDs) }
    }
    func claimWindowParts(_ keys: [String]) throws -> Set<String> {
        fleet.change { state in Set(keys.filter { state.claimedParts.insert($0).inserted }) }
    }
    func claimScheduledStarts(_ keys: [String]) throws -> Set<String> {
        fleet.change { state in Set(keys.filter { state.claimedParts.insert("scheduled " + $0).inserted }) }
    }
}

/// Grants everything: the rate limit's rules are the Redis script's, proven against Redis in RateLimitTests.
final class InMemoryCancellations: JobCancellations {
    let fleet: InMemoryFleet
    init(_ fleet: InMemoryFleet) { self.fleet = fleet }

    func cancelled(since: Double?) throws -> StoreAnswer<[CancelledJob]> {
        fleet.change { state in
            state.cancellationReads += 1
            return .answered(state.cancelled.filter { since == nil || $0.at >= since! })
        }
    }
}

final class InMemoryRateLimiter: RateLimiter {
    func reserve(urgent: Int, bulk: Int) throws -> RateReservation {
        .granted(urgent: urgent, bulk: bulk, nextWindowIn: 0)
    }
}

/// The fleet's window with no time: it holds whatever was added (a test starts it where it wants).
final class InMemoryInvalidationWindow: InvalidationWindow {
    private let fleet: InMemoryFleet

    init(_ fleet: InMemoryFleet) { self.fleet = fleet }

    func add(_ counts: InvalidationCounts) throws -> StoreAnswer<FleetInvalidationCounts> {
        fleet.change { state in
            state.invalidationWindow = state.invalidationWindow.map { $0 + counts }
            return state.invalidationWindow.map { .answered(FleetInvalidationCounts(lastMinute: $0, lastHour: $0)) }
                ?? .refused("WRONGTYPE")
        }
    }
}

final class InMemoryStatistics: StatisticsSink {
    private let fleet: InMemoryFleet

    init(_ fleet: InMemoryFleet) { self.fleet = fleet }

    func report(_ delta: WorkerStatistics.Snapshot, longestWait: LaneCounts, worker: String) throws -> StoreAnswer<Void>
    {
        fleet.change { $0.reports += 1 }
        return .answered(())
    }

    func recordSending(_ pools: Set<SendingPool>) throws -> StoreAnswer<Void> {
        fleet.change { $0.recentlySending.formUnion(pools) }
        return .answered(())
    }

    func sentRecently(within seconds: Double) throws -> StoreAnswer<[SendingPool]> {
        .answered(fleet.read { Array($0.recentlySending) })
    }
}

/// APNs in memory: answers each notification as `answer` says (read as the APNs client reads answers), on a thread
/// per lane as the client does; while the fleet holds answers, they wait for `releaseAnswers`.
final class InMemorySender: NotificationSender, @unchecked Sendable {
    private let fleet: InMemoryFleet
    private let answer: @Sendable (APNsNotification) -> APNsResponse
    /// What APNs answers each broadcast, read with the broadcast route's table.
    private let broadcastAnswer: @Sendable (APNsBroadcast) -> APNsResponse
    /// Topics no credential serves: their notifications and broadcasts are answered `unserved`, unsent (as the
    /// client does after a reload took their credential away). Changed at run time by a test.
    let unserved = Locked<Set<String>>([])
    private func isUnserved(_ topic: String) -> Bool { unserved.withLock { $0.contains(topic) } }
    /// What sent since `takeSendingPools` last asked: in memory, a topic's credential is called by the topic.
    private let sending = Locked<Set<SendingPool>>([])
    private let threads: [JobLane: DispatchQueue] = [
        .urgent: DispatchQueue(label: "in-memory-sender-urgent"),
        .bulk: DispatchQueue(label: "in-memory-sender-bulk")
    ]

    init(
        _ fleet: InMemoryFleet,
        answer: @escaping @Sendable (APNsNotification) -> APNsResponse = { _ in
            APNsResponse(status: 200)
        }, broadcastAnswer: @escaping @Sendable (APNsBroadcast) -> APNsResponse = { _ in APNsResponse(status: 200) }
    ) {
        self.fleet = fleet
        self.answer = answer
        self.broadcastAnswer = broadcastAnswer
    }

    func start(reportingHealth report: @escaping @Sendable (ConnectionHealth) -> Void) {
        threads[.urgent]!.async { report(.opened) }
    }

    func send(_ batch: [APNsNotification], lane: JobLane, answer reply: @escaping @Sendable (Int, APNsResult) -> Void)
        -> Int
    {
        let results = batch.map { notification in
            if isUnserved(notification.topic) {
                return APNsResult(outcome: .unserved, error: "no APNs credential serves topic " + notification.topic)
            }
            let response = answer(notification)
            return APNsResult(
                outcome: APNsRoute.device(token: notification.deviceToken).outcome(of: response),
                response: response)
        }
        let batch = batch.filter { !isUnserved($0.topic) }
        sending.withLock { $0.formUnion(batch.map { SendingPool(credential: $0.topic, environment: $0.environment) }) }
        let deliver: @Sendable () -> Void = { [thread = threads[lane]!] in
            thread.async { for (position, result) in results.enumerated() { reply(position, result) } }
        }
        let holding = fleet.change { state in
            state.sent += batch.map { (lane, $0.deviceToken) }
            if state.holdingAnswers { state.heldAnswers.append(deliver) }
            return state.holdingAnswers
        }
        if !holding { deliver() }
        return batch.count
    }

    /// What `streamCapacity` says of each lane (nothing: unknown, as before a connection opens).
    let streamCapacities = Locked<[JobLane: Int]>([:])
    func streamCapacity(_ lane: JobLane) -> Int? { streamCapacities.withLock { $0[lane] } }

    /// Each lane's queue marks itself, so that code on it can tell (`DispatchQueue.getSpecific`).
    private static let laneKey = DispatchSpecificKey<JobLane>()
    func isOnLaneThread(_ lane: JobLane) -> Bool {
        if threads[lane]!.getSpecific(key: Self.laneKey) == nil {
            threads[lane]!.setSpecific(key: Self.laneKey, value: lane)
        }
        return DispatchQueue.getSpecific(key: Self.laneKey) == lane
    }

    func schedule(after delay: Double, lane: JobLane, _ action: @escaping @Sendable () -> Void) {
        threads[lane]!.asyncAfter(deadline: .now() + delay, execute: action)
    }

    func send(
        _ broadcast: APNsBroadcast, environment: APNsEnvironment, lane: JobLane,
        answer reply: @escaping @Sendable (APNsResult) -> Void
    ) {
        if isUnserved(broadcast.bundle) {
            threads[lane]!.async {
                reply(APNsResult(outcome: .unserved, error: "no APNs credential serves topic " + broadcast.bundle))
            }
            return
        }
        fleet.change { $0.broadcastsSent.append(broadcast.channelID) }
        let response = broadcastAnswer(broadcast)
        let result = APNsResult(
            outcome: APNsRoute.broadcast(bundle: broadcast.bundle).outcome(of: response),
            response: response)
        threads[lane]!.async { reply(result) }
    }

    /// What the sender says of each topic: every topic sent, with no rate group, unless a test says otherwise.
    var topicService: @Sendable (String) -> TopicService = { _ in .served(rateGroup: nil) }

    func service(forTopic topic: String) -> TopicService { topicService(topic) }

    func shutdown() {}

    func takeSendingPools() -> Set<SendingPool> {
        sending.withLock { sending in
            defer { sending = [] }
            return sending
        }
    }

    func open(_ pools: [SendingPool]) { fleet.change { $0.openedAhead += pools } }
}
