import APNs
import Foundation
import Synchronization
import Telemetry

/// The pipeline's own settings (the configuration layer maps the environment to them).
public struct WorkerSettings: Sendable {
    public var core: WorkerCore.Settings
    /// The topic of jobs that name none (APNS_TOPIC), and the app whose plain cache entries serve it.
    public var defaultTopic: String?
    public var invalidationGuard: MassInvalidationGuard
    /// Attempts at notifications APNs asked to retry, before what is left is parked.
    public var maximumSendAttempts: Int
    /// Seconds a retry waits, by attempt (the last repeats).
    public var retryDelays: [Double]
    /// Deliveries of one job at most: a job delivered more often is parked unread, as a job that may stop the
    /// workers it is delivered to (a poison job) would otherwise go from worker to worker for ever.
    public var maximumDeliveries: Int
    /// Test-only fault: the process exits at once when it starts the job of this id (what a job that crashes
    /// workers does). Set only by debug builds.
    public var exitOnJobID: String?

    public init(core: WorkerCore.Settings, defaultTopic: String? = nil,
                invalidationGuard: MassInvalidationGuard = MassInvalidationGuard(threshold: 20),
                maximumSendAttempts: Int = 3, retryDelays: [Double] = [1, 15, 60, 300], maximumDeliveries: Int = 5,
                exitOnJobID: String? = nil) {
        self.maximumDeliveries = maximumDeliveries
        self.exitOnJobID = exitOnJobID
        self.core = core
        self.defaultTopic = defaultTopic
        self.invalidationGuard = invalidationGuard
        self.maximumSendAttempts = maximumSendAttempts
        self.retryDelays = retryDelays
    }
}

/// The worker: consumes jobs, resolves their users, sends their notifications, publishes what came of them, and
/// settles each job once every one of its notifications has a final outcome.
///
/// Threads: `run()` is the broker thread; it alone owns the session (broker and store connections, blocking C
/// clients) and performs what `WorkerCore` decides. The APNs client's loop thread owns the HTTP/2 connections and
/// every job's progress while its notifications are out. Work crosses between the two in batches: a batch of
/// notifications goes out in one `send`; finished jobs come back through `completions` with one wake-up.
public final class Worker: Service {
    public static let reasonHeader = "x-apns-worker-reason"
    /// On a job parked after its last attempt: how many attempts were made, and the device tokens still undelivered
    /// (comma-separated, the first `undeliveredListed` of them).
    public static let attemptsHeader = "x-apns-worker-attempts"
    public static let undeliveredHeader = "x-apns-worker-undelivered"
    static let undeliveredListed = 100
    /// How this process appears in the fleet's statistics and in `apns-worker stats`.
    public static let identity = "\(ProcessInfo.processInfo.hostName):\(getpid())"
    /// Final outcomes go to the idempotency record at least this often (seconds): a crash sends again what was
    /// unanswered plus at most this much of answers. One hand-over per interval, not one per answer.
    static let outcomeInterval = 0.01
    /// /readyz says not ready once the broker or the store has not answered for this long.
    static let readinessWindow = 3.0

    public let settings: WorkerSettings
    public let statistics = WorkerStatistics()
    private let logger: Logger
    private let apns: APNsClient
    private let connect: @Sendable () throws -> WorkerSession
    private let completions = Locked<[JobProgress]>([])
    /// Final outcomes of jobs still under way, handed over every `outcomeInterval` for the idempotency record.
    private let finalOutcomes = Locked<[(jobID: String, outcomes: [SettledOutcome])]>([])
    /// Loop thread only: jobs with final outcomes not handed over yet, and whether a hand-over is scheduled.
    private let outcomesAwaiting = LoopConfined<(jobs: [JobProgress], scheduled: Bool)>(([], false))
    private let wakeup = Wakeup()
    private let stopRequested = Atomic<Bool>(false)
    private let consuming = Atomic<Bool>(false)
    /// When the broker and the store last answered a round trip (monotonic nanoseconds).
    private let lastAlive = Atomic<UInt64>(0)

    /// `connect` opens one session (broker and store); it is called on the broker thread, again after each loss.
    public init(settings: WorkerSettings, apns configuration: APNsClientConfiguration,
                authentication: APNsAuthentication, logger: Logger,
                connect: @escaping @Sendable () throws -> WorkerSession) {
        self.settings = settings
        self.logger = logger
        self.connect = connect
        var apnsConfiguration = configuration
        let statistics = self.statistics
        apnsConfiguration.observer = { _, event in
            switch event {
            case .opened: statistics.connectionsOpened.add(1, ordering: .relaxed)
            case .closed: statistics.connectionsClosed.add(1, ordering: .relaxed)
            case .goAway: statistics.goAways.add(1, ordering: .relaxed)
            case .connectFailed: statistics.connectFailures.add(1, ordering: .relaxed)
            case .pingAcknowledged: break
            }
        }
        apns = APNsClient(configuration: apnsConfiguration, authentication: authentication,
                          logger: logger.child("apns-client"))
    }

    /// Whether the worker can work now: consuming, the broker and the store answering (a round trip within the last
    /// `readinessWindow` seconds), and an APNs connection open.
    public var isReady: Bool {
        let sinceAlive = Double(DispatchTime.now().uptimeNanoseconds &- lastAlive.load(ordering: .relaxed)) / 1e9
        return consuming.load(ordering: .relaxed) && sinceAlive < Self.readinessWindow && statistics.openConnections > 0
    }

    public var metricsText: String { statistics.prometheusText(ready: isReady) }

    /// Asks `run()` to stop consuming, finish what is under way (up to the shutdown timeout) and return.
    public func stop() {
        stopRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// Runs until `stop()`; reconnects with back-off when the broker or the store goes away. Only connection
    /// failures reach here: a data error (a key of the wrong type, a bad job) is settled where it concerns one user,
    /// token or job, and the rest of the batch proceeds. Before the first session, a refusal that waiting cannot
    /// cure (`ConnectionRefused`: credentials, a vhost, a database) is thrown; a broker or store that is merely down
    /// is waited for.
    public func run() throws {
        apns.connect(.production)
        var generation = 0
        var backoff = ReconnectBackoff()
        var shared = statistics.snapshot()
        var connectedOnce = false
        while !stopRequested.load(ordering: .acquiring) {
            generation += 1
            do {
                let session = try connect()
                connectedOnce = true
                backoff.connected()
                lastAlive.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed)
                consuming.store(true, ordering: .relaxed)
                logger.info("consuming", session.logMetadata)
                try serve(session, generation: generation, sharedThrough: &shared)
                consuming.store(false, ordering: .relaxed)
                break
            } catch {
                consuming.store(false, ordering: .relaxed)
                if !connectedOnce, error is ConnectionRefused {
                    apns.shutdown()
                    throw error
                }
                let delay = backoff.failed()
                logger.error("broker or Redis unavailable; reconnecting", ["error": "\(error)",
                                                                         "failures_in_a_row": String(backoff.failures),
                                                                         "retry_in_s": String(format: "%.2f", delay)])
                wakeup.wait(timeout: delay)
            }
        }
        apns.shutdown()
        logger.info("worker stopped", ["stats": statistics.snapshot().summary])
    }

    /// Jobs that name themselves (an `id` in the body, or a message-id) can be recognised when redelivered; a
    /// delivery tag changes with every delivery.
    private static func hasStableID(_ job: PushJob, _ delivery: JobDelivery) -> Bool {
        job.idFromBody || delivery.properties.messageID != nil
    }

    /// The delay for a retry: the tier for this attempt, or a longer one if APNs asked for a longer wait.
    private func retryDelay(attempt: Int, suggestedDelay: Double) -> Double {
        let delays = settings.retryDelays
        let byAttempt = min(attempt - 1, delays.count - 1)
        let bySuggestion = delays.firstIndex { $0 >= suggestedDelay } ?? delays.count - 1
        return delays[max(byAttempt, bySuggestion)]
    }

    // MARK: broker thread

    /// Performs what the core decides, turn after turn, until it says to leave. `sharedThrough`: the counters already
    /// added to the fleet's statistics.
    private func serve(_ session: WorkerSession, generation: Int,
                       sharedThrough shared: inout WorkerStatistics.Snapshot) throws {
        var core = WorkerCore(settings: settings.core, generation: generation, now: Date())
        // Notifications waiting for room in flight or for rate-limit permits, per lane; bounded by the prefetch, as
        // their jobs are unacknowledged. Each is its job and index: the request is built only when it goes out.
        var backlogs = Backlogs()
        // Bulk jobs read but not started yet (started a few at a time, as the bulk lane makes room).
        var unstartedBulk: [JobDelivery] = []
        var held = HeldPublishes()
        var suspects = SuspectQueue()
        // Ending this session is not dying: a suspect under way did not stop the worker.
        defer { if let key = suspects.alone { try? session.record.settledAlone(key) } }
        var lastProgress = (at: Date(), snapshot: statistics.snapshot())
        /// Urgent jobs start at once, bulk jobs wait their turn.
        func dispatch(_ batch: [JobDelivery]) throws {
            let urgent = batch.filter { $0.lane == .urgent }
            unstartedBulk += batch.filter { $0.lane == .bulk }
            if !urgent.isEmpty {
                core.handle(.jobsStarted(try start(urgent, session: session, generation: generation,
                                                   into: &backlogs, held: &held)))
            }
        }
        while true {
            let finished = completions.withLock { queue -> [JobProgress] in
                defer { queue.removeAll(keepingCapacity: true) }
                return queue
            }
            let current = finished.filter { core.isCurrent(generation: $0.generation) }
            let outcomes = finalOutcomes.withLock { queue -> [(jobID: String, outcomes: [SettledOutcome])] in
                defer { queue.removeAll(keepingCapacity: true) }
                return queue
            }
            let now = Date()
            var deliveriesRead = 0
            for action in core.beginTurn(.init(now: now, stopRequested: stopRequested.load(ordering: .acquiring),
                                               outcomesWaiting: !outcomes.isEmpty, completedJobs: current.count,
                                               staleCompletions: finished.count - current.count,
                                               heldDue: held.nextDue)) {
                switch action {
                case .announceStop(let jobs):
                    logger.info("stopping: finishing jobs under way", ["jobs.in_flight": String(jobs),
                                                                      "jobs.unstarted_bulk": String(unstartedBulk.count)])
                case .requeueUnstartedBulk:
                    // Nothing read and not started is kept: unstarted bulk jobs, and jobs waiting for suspects.
                    for delivery in unstartedBulk + suspects.giveBack() { try session.broker.requeue(delivery.tag) }
                    unstartedBulk.removeAll()
                case .exit(let exit):
                    if case .deadlinePassed(let unfinished) = exit {
                        logger.warning("shutdown deadline passed; the broker will redeliver unfinished jobs",
                                       ["jobs.in_flight": String(unfinished)])
                    }
                    let now = statistics.snapshot()
                    _ = try? session.statistics.report(now.subtracting(shared),
                                                                longestWait: statistics.longestWait.take(), worker: Self.identity)
                    shared = now
                    session.broker.close()
                    return
                case .recordOutcomes:
                    try record(outcomes, session: session)
                case .discardStale(let count):
                    logger.debug("completions from an earlier broker connection dropped", ["jobs": String(count)])
                case .finishCompleted:
                    core.handle(.jobsSettled(try finish(current, session: session, held: &held)))
                case .publishHeld:
                    if let due = held.takeDue() {
                        if !due.jobs.isEmpty { core.handle(.jobsSettled(try finish(due.jobs, session: session, held: &held))) }
                        if !due.rejections.isEmpty { try reject(due.rejections, session: session, held: &held) }
                    }
                case .readDeliveries(let limit):
                    var batch: [JobDelivery] = []
                    for notice in try session.broker.receive(limit: limit) {
                        switch notice {
                        case .delivery(let delivery):
                            batch.append(delivery)
                        case .publishingBlocked(let blocked):
                            logger.warning(blocked ? "broker blocks publishers (resource alarm)" : "broker unblocked")
                            statistics.brokerBlocked.store(blocked, ordering: .relaxed)
                            if blocked { statistics.brokerBlocks.add(1, ordering: .relaxed) }
                        }
                    }
                    deliveriesRead = batch.count
                    note(taken: batch)
                    let sorted = try triage(batch, session: session)
                    if !sorted.poison.isEmpty { try reject(sorted.poison, session: session, held: &held) }
                    try dispatch(suspects.admit(usual: sorted.usual, suspects: sorted.suspects))
                default:
                    break
                }
            }
            let (ended, next) = suspects.step(jobsInFlight: core.jobsInFlight, stopping: core.isStopping,
                                              key: Self.historyKey)
            if let ended { try session.record.settledAlone(ended) }
            switch next {
            case .startAlone(let suspect, let key):
                try session.record.startingAlone(key)
                logger.warning("starting a job alone: it came back twice or more without being settled",
                               ["amqp.message_id": suspect.properties.messageID ?? "", "job.history_key": key,
                                "jobs.waiting": String(suspects.waiting.count + suspects.behind.count)])
                core.handle(.jobsStarted(try start([suspect], session: session, generation: generation,
                                                   into: &backlogs, held: &held)))
            case .dispatch(let waiting):
                try dispatch(waiting)
            case .none:
                break
            }
            let later = Date()
            for action in core.endTurn(now: later, deliveriesRead: deliveriesRead, queued: backlogs.counts,
                                       inFlight: statistics.inFlight.counts,
                                       unstartedBulkJobs: suspects.isActive ? 0 : unstartedBulk.count,
                                       heldDue: held.nextDue) {
                switch action {
                case .send(let urgent, let bulk):
                    if let limited = try send(LaneCounts(urgent: urgent, bulk: bulk), from: &backlogs, session: session) {
                        core.handle(.rateLimited(limited.lanes, nextWindowIn: limited.wait, at: later))
                    }
                case .startBulk(let limit):
                    let starting = Array(unstartedBulk.prefix(limit))
                    unstartedBulk.removeFirst(starting.count)
                    core.handle(.jobsStarted(try start(starting, session: session, generation: generation,
                                                       into: &backlogs, held: &held)))
                case .probe:
                    // Readiness is the broker and the store as they are now: a round trip to each. One that does not
                    // answer within its timeout ends this session (reconnect); meanwhile /readyz goes stale.
                    try session.store.probe()
                    try session.broker.probe()
                    lastAlive.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed)
                    core.handle(.probed(later))
                case .reportStatistics:
                    let now = statistics.snapshot()
                    if let refused = try session.statistics.report(now.subtracting(shared),
                                                                longestWait: statistics.longestWait.take(), worker: Self.identity) {
                        statistics.countDataError("statistics")
                        logger.warning("Redis refused the shared statistics", ["redis.error": refused])
                    }
                    shared = now
                    core.handle(.reported(later))
                case .logProgress:
                    let now = statistics.snapshot()
                    if now != lastProgress.snapshot {
                        let answered = now.subtracting(lastProgress.snapshot)
                        let rate = Double(answered.delivered + answered.deadTokens + answered.permanentFailures)
                            / later.timeIntervalSince(lastProgress.at)
                        logger.info("progress", ["stats": now.summary, "jobs.in_flight": String(core.jobsInFlight),
                                                 "notifications_per_s": String(Int(rate.rounded())),
                                                 "apns.in_flight": String(statistics.notificationsInFlight)])
                    }
                    lastProgress = (later, now)
                    core.handle(.progressLogged(later))
                case .wait(let seconds, let watchingBroker):
                    // While stopping, deliveries are left unread (the broker requeues them), so only wake-ups count.
                    if !session.broker.hasBufferedInput {
                        wakeup.wait(alsoReadable: watchingBroker ? session.broker.readableDescriptor : nil, timeout: seconds)
                    }
                default:
                    break
                }
            }
        }
    }

    /// Counts the jobs taken from each lane, and how long they had waited there (from their timestamp).
    private func note(taken batch: [JobDelivery]) {
        let now = Date().timeIntervalSince1970
        for delivery in batch {
            statistics.jobsTaken.add(delivery.lane, 1)
            if let published = delivery.properties.timestamp {
                statistics.longestWait.raise(delivery.lane, to: Int(max(0, (now - Double(published)) * 1000)))
            }
        }
    }

    /// Hands up to `wanted` queued notifications of each lane to the APNs client, urgent first (fewer if the shared
    /// rate limit grants fewer); returns the lanes the rate limit held back, with the seconds until more may go.
    /// Notifications whose job's deadline has passed are settled as expired on the way, without a permit or a
    /// request.
    private func send(_ wanted: LaneCounts, from backlogs: inout Backlogs,
                      session: WorkerSession) throws -> (lanes: [JobLane], wait: Double)? {
        let now = Date().timeIntervalSince1970
        var sending: [JobLane: [(progress: JobProgress, index: Int32)]] = [:]
        var expired: [(progress: JobProgress, index: Int32)] = []
        for lane in JobLane.allCases where wanted[lane] > 0 {
            let taken = backlogs.withQueue(lane) { $0.take(upTo: wanted[lane], liveAt: now) }
            sending[lane] = taken.live
            expired += taken.expired
        }
        if !expired.isEmpty { settleExpired(expired) }
        var limited: (lanes: [JobLane], wait: Double)?
        if let rateLimiter = session.rateLimiter {
            let asked = LaneCounts(urgent: sending[.urgent]?.count ?? 0, bulk: sending[.bulk]?.count ?? 0)
            guard asked.total > 0 else { return nil }
            var granted = LaneCounts()
            let reservation = try rateLimiter.reserve(urgent: asked.urgent, bulk: asked.bulk)
            switch reservation {
            case .granted(let urgent, let bulk, let nextWindowIn):
                granted = LaneCounts(urgent: urgent, bulk: bulk)
                let short = reservation.lanesHeldBack(asked: asked)
                if !short.isEmpty {
                    limited = (short, nextWindowIn)
                    statistics.rateLimitWaits.add(1, ordering: .relaxed)
                }
            case .refused(let message):
                // The store refused the reservation (a slot key of the wrong type): nothing goes out unmetered; the
                // slot keys expire within 10 s, so waiting a second and asking again is enough.
                statistics.countDataError("rate_limit")
                logger.error("Redis refused the rate-limit reservation; waiting", ["redis.error": message])
                limited = (JobLane.allCases, 1)
            }
            for lane in JobLane.allCases {
                guard let entries = sending[lane], granted[lane] < entries.count else { continue }
                backlogs.withQueue(lane) { $0.putBack(entries[granted[lane]...]) }
                sending[lane] = Array(entries.prefix(granted[lane]))
            }
        }
        // Answers wake this thread to send more each time a batch's worth of room opened (or half the window, for
        // small windows): hand-overs stay small, so an urgent one never waits long behind a bulk one.
        let maximum = settings.core.maximumNotificationsInFlight
        let lowWater = max(maximum - settings.core.sendBatchLimit, maximum / 2)
        for lane in JobLane.allCases {
            guard let entries = sending[lane], !entries.isEmpty else { continue }
            statistics.inFlight.add(lane, entries.count)
            statistics.sent.add(lane, entries.count)
            let handedOver = DispatchTime.now().uptimeNanoseconds
            let latency = statistics.latency(lane)
            apns.send(entries.map { $0.progress.notification(Int($0.index)) }, traffic: lane.traffic) { [self] position, result in
                latency.observe(nanoseconds: DispatchTime.now().uptimeNanoseconds &- handedOver)
                if statistics.inFlight.add(lane, -1) == lowWater { wakeup.signal() }
                let (progress, index) = entries[position]
                record(result, for: progress, Int(index))
            }
        }
        return limited
    }

    /// Notifications whose deadline passed before they could be handed to APNs: settled as expired on the loop
    /// thread, which owns their jobs' progress while they are out.
    private func settleExpired(_ expired: [(progress: JobProgress, index: Int32)]) {
        statistics.expired.add(expired.count, ordering: .relaxed)
        apns.schedule(after: 0) { [self] in
            for (progress, index) in expired {
                progress.recordExpired(Int(index))
                noteOutcome(of: progress)
            }
        }
    }

    /// Decodes a batch, rejects the bad jobs, resolves users in one round trip to the store and queues every
    /// notification for sending. Returns how many jobs are now waiting for outcomes.
    private func start(_ batch: [JobDelivery], session: WorkerSession, generation: Int,
                       into backlogs: inout Backlogs, held: inout HeldPublishes) throws -> Int {
        var rejected: [(JobDelivery, String)] = []
        var jobs: [(JobDelivery, PushJob)] = []
        for delivery in batch {
            let fallbackID = delivery.properties.messageID ?? "delivery-\(delivery.tag)"
            do {
                let job = try PushJob.decode(delivery.body, defaultTopic: settings.defaultTopic, fallbackID: fallbackID)
                if let exitOnJobID = settings.exitOnJobID, job.id == exitOnJobID {
                    logger.critical("test fault: exiting on this job", ["job.id": job.id])
                    exit(70)
                }
                jobs.append((delivery, job))
            } catch {
                rejected.append((delivery, error.description))
            }
        }
        let resolved = try session.tokens.resolve(jobs.flatMap { $0.1.retryTargets == nil ? $0.1.users : [] })
        statistics.countDataError("token_cache_read", resolved.unreadable.count)
        // A redelivered job may have been under way when a worker died: skip what already had a final outcome.
        let redelivered = jobs.filter { $0.0.redelivered && Self.hasStableID($0.1, $0.0) }.map(\.1.id)
        let (alreadySettled, unreadableRecords) = try session.record.settled(jobIDs: redelivered)
        for (jobID, message) in unreadableRecords {
            statistics.countDataError("idempotency_record")
            logger.error("the idempotency record cannot be read; the redelivered job is sent whole",
                         ["job.id": jobID, "redis.error": message])
        }

        var progresses: [JobProgress] = []
        var finishedAtOnce: [JobProgress] = []
        for (delivery, job) in jobs {
            var targets = job.retryTargets
                ?? Self.targets(of: job, resolved: resolved.tokens,
                                reaching: TopicMatcher(topic: job.topic, defaultTopic: settings.defaultTopic))
            let settled = alreadySettled[job.id]
            if let done = settled?.tokens, !done.isEmpty {
                let before = targets.count
                targets.removeAll { done.contains($0.token) }
                statistics.duplicatesAvoided.add(before - targets.count, ordering: .relaxed)
            }
            let progress = JobProgress(job: job, delivery: delivery, generation: generation, targets: targets,
                                       hasStableID: Self.hasStableID(job, delivery))
            if let settled { progress.restore(settled: settled.tokens.count, dead: settled.dead) }
            progresses.append(progress)
            if targets.isEmpty {
                finishedAtOnce.append(progress)
                continue
            }
            backlogs.withQueue(delivery.lane) { $0.append(progress, count: targets.count) }
        }
        if !rejected.isEmpty { try reject(rejected, session: session, held: &held) }
        let settled = finishedAtOnce.isEmpty ? 0 : try finish(finishedAtOnce, session: session, held: &held)
        return progresses.count - settled
    }

    /// The key a job's delivery history is kept under: its message-id or, without one, its body.
    static func historyKey(_ delivery: JobDelivery) -> String {
        delivery.properties.messageID.map { "id:" + $0 } ?? "body:" + fingerprint(delivery.body)
    }

    /// A job at this delivery or later came back twice without being settled: it is started alone (one broker
    /// failover explains one redelivery, not two).
    var suspectFrom: Int { min(3, settings.maximumDeliveries + 1) }

    /// Sorts a batch: jobs to start as usual, suspects to start alone, and poison jobs to park (delivered more than
    /// the maximum, the last time alone in a worker that then died).
    private func triage(_ batch: [JobDelivery], session: WorkerSession) throws
        -> (usual: [JobDelivery], suspects: [JobDelivery], poison: [(JobDelivery, String)]) {
        let deliveries = try deliveriesSoFar(of: batch, session: session)
        // The common case, no job delivered before: the batch as it is.
        guard !deliveries.isEmpty else { return (batch, [], []) }
        let overLimit = batch.filter { (deliveries[$0.tag] ?? 1) > settings.maximumDeliveries }.map(Self.historyKey)
        let diedAlone = overLimit.isEmpty ? [] : try session.record.diedAlone(overLimit)
        var usual: [JobDelivery] = [], suspects: [JobDelivery] = [], poison: [(JobDelivery, String)] = []
        for delivery in batch {
            let count = deliveries[delivery.tag] ?? 1
            if count > settings.maximumDeliveries && diedAlone.contains(Self.historyKey(delivery)) {
                statistics.poisonJobs.add(1, ordering: .relaxed)
                logger.error("poison job parked: delivered more often than allowed, and a worker died with it alone",
                             ["job.deliveries": String(count), "job.max_deliveries": String(settings.maximumDeliveries),
                              "amqp.message_id": delivery.properties.messageID ?? ""])
                try session.record.forget(Self.historyKey(delivery))
                poison.append((delivery, "delivered \(count) times, more than the \(settings.maximumDeliveries) allowed "
                                   + "(WORKER_MAX_DELIVERIES), and the last time it was the only job of a worker that "
                                   + "ended without settling it: the job stops workers"))
            } else if count >= suspectFrom {
                suspects.append(delivery)
            } else {
                usual.append(delivery)
            }
        }
        return (usual, suspects, poison)
    }

    /// How many times each redelivered job of the batch has been delivered, this delivery included: as the broker
    /// counts them (quorum queues), else as the fleet counts them in the store. First deliveries cost nothing.
    private func deliveriesSoFar(of batch: [JobDelivery], session: WorkerSession) throws -> [UInt64: Int] {
        var counts: [UInt64: Int] = [:]
        var uncounted: [(tag: UInt64, key: String)] = []
        for delivery in batch where delivery.redelivered {
            if let before = delivery.properties.deliveryCount {
                counts[delivery.tag] = before + 1
            } else {
                uncounted.append((delivery.tag, Self.historyKey(delivery)))
            }
        }
        guard !uncounted.isEmpty else { return counts }
        let (redeliveries, unreadable) = try session.record.countRedeliveries(of: uncounted.map(\.key))
        for (key, message) in unreadable {
            statistics.countDataError("delivery_count")
            logger.error("a redelivered job's delivery count cannot be read; the job is handled",
                         ["redis.error": message, "job.history_key": key])
        }
        for (tag, key) in uncounted {
            // The first delivery was not counted: the store holds redeliveries only.
            if let redelivered = redeliveries[key] { counts[tag] = redelivered + 1 }
        }
        return counts
    }

    /// FNV-1a, 64 bits, in hex: the same body gives the same key in every worker (Swift's `Hasher` is seeded per
    /// process).
    static func fingerprint(_ body: [UInt8]) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in body {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return String(hash, radix: 16)
    }

    /// A new job's device tokens: its own, then those of its users' tokens that serve its topic, each token once (a
    /// device can be named twice, or sit under two users of a cache other systems feed). A user's tokens of other
    /// kinds (a VoIP token for an alert, another app's token) are never reached.
    private static func targets(of job: PushJob, resolved: [String: [CachedToken]],
                                reaching matcher: TopicMatcher) -> [DeviceTarget] {
        var targets: [DeviceTarget] = []
        // Sized once: growing a set of tokens while hashing them again would cost more than the lookups.
        var seen = Set<String>(minimumCapacity: job.tokens.count + job.users.count * 2)
        for token in job.tokens where seen.insert(token).inserted {
            targets.append(DeviceTarget(token: token, environment: job.environment, user: nil))
        }
        for user in job.users {
            for cached in resolved[user] ?? [] where matcher.serves(cached.scope) && seen.insert(cached.token).inserted {
                targets.append(DeviceTarget(token: cached.token, environment: cached.scope.environment, user: user))
            }
        }
        return targets
    }

    /// Bad jobs are parked with their reason, confirmed, then acknowledged. One the broker hands back (the failed
    /// queue was deleted) or refuses stays unacknowledged and is parked again after a pause.
    private func reject(_ rejected: [(JobDelivery, String)], session: WorkerSession, held: inout HeldPublishes) throws {
        var publications: [Publication] = []
        for (delivery, reason) in rejected {
            var properties = delivery.properties
            properties.persistent = true
            properties.headers[Self.reasonHeader] = reason
            publications.append(Publication(destination: .failed, body: delivery.body, properties: properties))
            logger.warning("job rejected", ["job.reason": reason, "amqp.delivery_tag": String(delivery.tag)])
        }
        let outcomes = try session.broker.publish(publications)
        var settled: [UInt64] = []
        for ((delivery, reason), outcome) in zip(rejected, outcomes) {
            if outcome == .taken {
                settled.append(delivery.tag)
                statistics.jobsRejected.add(1, ordering: .relaxed)
            } else {
                held.hold(rejection: (delivery, reason))
                statistics.countRefusedPublish("rejected_job")
            }
        }
        if settled.count < rejected.count {
            logger.error("the broker did not take parked jobs; kept unacknowledged, parked again shortly",
                         ["jobs": String(rejected.count - settled.count), "retry_in_s": String(HeldPublishes.pause)])
        }
        try session.broker.acknowledge(settled)
    }

    /// Publishes what finished jobs produced (dead-token events, parked jobs, retries, summaries), waits for the
    /// broker's confirms, takes the dead tokens out of the cache, then acknowledges the jobs. Returns how many jobs
    /// it settled.
    ///
    /// Events, parked jobs and retries must not be lost: one the broker hands back (its queue was deleted) or
    /// refuses leaves its job unacknowledged and held, and its publications are made again after a pause
    /// (`HeldPublishes`), so nothing is acknowledged that was not published. A summary to a `reply_to` queue that
    /// does not exist is logged; it holds nothing up. The order makes a crash repeat work, never lose an event: a
    /// token leaves the cache only once its event is safe with the broker.
    private func finish(_ finished: [JobProgress], session: WorkerSession, held: inout HeldPublishes) throws -> Int {
        var publications: [Publication] = []
        // Per job, which of the publications are its own, and which one is its summary.
        var owned: [(range: Range<Int>, summary: Int?)] = []
        for progress in finished {
            settleTokenMismatches(progress)
            let first = publications.count
            for (target, response) in progress.dead {
                let event = DeadTokenEvent(token: target.token, user: target.user, topic: progress.job.topic,
                                           environment: target.environment, status: response.status,
                                           reason: response.reason?.label ?? "", timestamp: response.timestamp,
                                           jobID: progress.job.id)
                publications.append(Publication(destination: .deadTokens, body: event.json, properties: MessageProperties()))
            }
            let delay = retryDelay(attempt: progress.job.attempt,
                                   suggestedDelay: progress.retryable.map(\.delay).max() ?? 0)
            if let deadline = progress.job.deadline, !progress.retryable.isEmpty {
                // A retry that could only come after the deadline would not be sent: those expire now.
                let before = progress.expired
                progress.expireRetryable(before: deadline, retryAt: Date().timeIntervalSince1970 + delay)
                statistics.expired.add(progress.expired - before, ordering: .relaxed)
            }
            let retrying = !progress.retryable.isEmpty && progress.job.attempt < settings.maximumSendAttempts
            if retrying {
                // Another attempt waits in a delay queue that dead-letters back to the queue of the job's lane:
                // nothing is held here, and the retry survives this worker.
                var properties = progress.delivery.properties
                properties.persistent = true
                // The retry's wait in its lane is the delay it was given, not a queue falling behind.
                properties.timestamp = nil
                properties.headers[Self.reasonHeader] = progress.retryable[0].reason
                publications.append(Publication(
                    destination: .retry(delay: delay, lane: progress.delivery.lane),
                    body: progress.job.retryBody(targets: progress.retryable.map(\.target), original: progress.delivery.body),
                    properties: properties))
            } else if let first = progress.retryable.first {
                // Parked as its sender enqueued it, with what happened in headers.
                var properties = progress.delivery.properties
                properties.persistent = true
                let reason = "\(progress.retryable.count) of \(progress.targets.count) notifications not delivered after "
                    + "\(progress.job.attempt) attempts: \(first.reason)"
                properties.headers[Self.reasonHeader] = reason
                properties.headers[Self.attemptsHeader] = String(progress.job.attempt)
                properties.headers[Self.undeliveredHeader] = progress.retryable.prefix(Self.undeliveredListed)
                    .map(\.target.token).joined(separator: ",")
                publications.append(Publication(destination: .failed, body: progress.job.originalBody ?? progress.delivery.body,
                                                properties: properties))
                logger.error("job parked after its last attempt", ["job.id": progress.job.id, "job.reason": reason])
            }
            var summary: Int?
            if let replyTo = progress.delivery.properties.replyTo, !replyTo.isEmpty {
                summary = publications.count
                publications.append(Publication(
                    destination: .reply(replyTo), body: progress.summaryJSON(retrying: retrying),
                    properties: MessageProperties(correlationID: progress.delivery.properties.correlationID ?? progress.job.id,
                                                  persistent: false)))
            }
            owned.append((first..<publications.count, summary))
        }
        let outcomes = try session.broker.publish(publications)
        var confirmed: [JobProgress] = []
        var refused: [JobProgress] = []
        for (progress, own) in zip(finished, owned) {
            let mustNotBeLost = own.range.filter { $0 != own.summary }
            if mustNotBeLost.contains(where: { outcomes[$0] != .taken }) {
                refused.append(progress)
                continue
            }
            confirmed.append(progress)
            if let summary = own.summary, outcomes[summary] != .taken {
                statistics.countRefusedPublish("summary")
                logger.warning("a job's summary was not taken: no queue named by its reply_to",
                               ["job.id": progress.job.id, "amqp.reply_to": progress.delivery.properties.replyTo ?? ""])
            }
        }
        // Only an entry that still serves the job's topic in that environment goes: a token registered since for
        // another kind or app is someone else's. Tokens sent directly are left to the cleanup consumer's events.
        let removals = confirmed.flatMap { progress in
            let matcher = TopicMatcher(topic: progress.job.topic, defaultTopic: settings.defaultTopic)
            return progress.dead.compactMap { dead in
                dead.target.user.map { user in
                    (progress.job.id, TokenRemoval(user: user, token: dead.target.token,
                                                   unlessRegisteredAfter: dead.response.timestamp,
                                                   onlyIfValueIn: matcher.cacheValues(in: dead.target.environment)))
                }
            }
        }
        // A removal the store refuses (a key of the wrong type) concerns that token only: its event is out, the job
        // is settled, and the cleanup consumer will meet the same key and park the event with the reason.
        for ((jobID, removal), change) in zip(removals, try session.tokens.remove(removals.map(\.1))) {
            guard case .failed(let message) = change else { continue }
            statistics.countDataError("token_removal")
            logger.error("Redis refused to remove a dead token", ["job.id": jobID, "user": removal.user,
                                                                  "apns.token": Redact.token(removal.token),
                                                                  "redis.error": message])
        }
        // A held job's outcomes go to the idempotency record now: if this connection drops before its publications
        // are made again, its redelivery sends nothing twice and still publishes its dead tokens' events.
        let unrecorded = refused.compactMap { progress in progress.takeUnrecordedFinal().map { (progress.job.id, $0) } }
        if !unrecorded.isEmpty { try record(unrecorded, session: session) }
        for progress in refused {
            held.hold(job: progress)
            statistics.countRefusedPublish("job_outputs")
            logger.error("the broker did not take what a job produced; kept unacknowledged, published again shortly",
                         ["job.id": progress.job.id, "retry_in_s": String(HeldPublishes.pause)])
        }
        var completed: [UInt64] = []
        completed.reserveCapacity(confirmed.count)
        for progress in confirmed {
            completed.append(progress.delivery.tag)
            statistics.jobsCompleted.add(1, ordering: .relaxed)
            if !progress.retryable.isEmpty {
                if progress.job.attempt < settings.maximumSendAttempts {
                    statistics.retries.add(progress.retryable.count, ordering: .relaxed)
                } else {
                    statistics.jobsParked.add(1, ordering: .relaxed)
                }
            }
            logger.debug("job done", ["job.id": progress.job.id, "job.attempt": String(progress.job.attempt),
                                      "job.notifications": String(progress.targets.count),
                                      "job.delivered": String(progress.delivered), "job.dead": String(progress.dead.count),
                                      "job.failed": String(progress.failed.count),
                                      "job.retryable": String(progress.retryable.count)])
        }
        try session.broker.acknowledge(completed)
        return confirmed.count
    }

    /// The mass-invalidation guard, once a job's outcomes are all in: its 400 mismatch answers either count as dead
    /// tokens (removed, with events) or, when they look like a configuration mistake, are held back, logged at error
    /// level and counted. 410s are never held back.
    private func settleTokenMismatches(_ progress: JobProgress) {
        guard let held = progress.applyGuard(settings.invalidationGuard) else { return }
        statistics.deadTokens.add(progress.dead.filter { APNsOutcome.isTokenMismatch($0.response) }.count,
                                  ordering: .relaxed)
        guard held > 0 else { return }
        statistics.heldBack.add(held, ordering: .relaxed)
        statistics.invalidationGuardTrips.add(1, ordering: .relaxed)
        let reasons = Set(progress.heldBack.compactMap { $0.response.reason?.rawValue }).sorted().joined(separator: ",")
        logger.error("mass invalidation guard: 400 answers held back as a configuration error, no token removed", [
            "job.id": progress.job.id, "apns.reason": reasons, "apns.topic": progress.job.topic,
            "job.held_back": String(held), "job.answers": String(progress.answered),
            "job.dead": String(progress.dead.count), "job.problem": progress.heldBackExplanation ?? "",
        ])
    }

    /// Adds final outcomes to the idempotency record. A record the store refuses concerns that job only: logged and
    /// counted (a redelivery of it would send its notifications again), never a reconnect.
    private func record(_ outcomes: [(jobID: String, outcomes: [SettledOutcome])], session: WorkerSession) throws {
        for (jobID, message) in try session.record.record(outcomes) {
            statistics.countDataError("idempotency_record")
            logger.error("Redis refused the idempotency record", ["job.id": jobID, "redis.error": message])
        }
    }

    // MARK: APNs loop thread

    private func record(_ result: APNsResult, for progress: JobProgress, _ index: Int) {
        if result.response != nil { progress.countAnswer() }
        // Metrics and summaries carry Apple's documented reasons or `other` (`APNsReason.label`), and without an
        // answer a fixed word: what an endpoint writes, or an error text, would make endless label values.
        let reasonLabel = result.response?.reason?.label
        if result.outcome != .delivered {
            statistics.countUnsuccessful(status: result.response?.status, reason: reasonLabel
                                         ?? (result.response == nil ? (result.outcome == .permanentFailure
                                                                       ? "not_sent" : "no_answer") : ""))
        }
        switch result.outcome {
        case .delivered:
            progress.recordDelivered(index)
            statistics.delivered.add(1, ordering: .relaxed)
        case .deadToken:
            let response = result.response ?? APNsResponse(status: 410)
            progress.recordDead(index, response)
            // A 400 mismatch is counted once the job is complete, as dead or as held back (`settleTokenMismatches`).
            if !APNsOutcome.isTokenMismatch(response) { statistics.deadTokens.add(1, ordering: .relaxed) }
        case .permanentFailure:
            let reason = result.response.map { reasonLabel ?? "status \($0.status)" } ?? result.error ?? "not sent"
            progress.recordFailed(index, reason: reason)
            statistics.permanentFailures.add(1, ordering: .relaxed)
            logger.warning("notification failed", ["job.id": progress.job.id,
                                                   "apns.reason": Redact.outsideText(result.response?.reason?.rawValue ?? reason),
                                                   "apns.status": String(result.response?.status ?? 0),
                                                   "apns.token": Redact.token(progress.targets[index].token)])
        case .retryLater(let suggested):
            progress.recordRetryable(index, reason: reasonLabel ?? result.error ?? "retry later", delay: suggested)
        case .refreshTokenAndRetry, .replaceConnectionAndRetry:
            progress.recordRetryable(index, reason: reasonLabel ?? "provider token", delay: 1)
        }
        noteOutcome(of: progress)
    }

    /// Loop thread, after an outcome: a complete job goes back to the broker thread; final outcomes of a job still
    /// under way are handed over for the idempotency record within `outcomeInterval`.
    private func noteOutcome(of progress: JobProgress) {
        if progress.isComplete {
            // From here the broker thread owns the job, its outcomes not yet recorded included (finish settles it).
            progress.handedBack = true
            completions.withLock { $0.append(progress) }
            wakeup.signal()
        } else if !progress.unrecordedFinal.isEmpty && !progress.awaitsHandOver {
            progress.awaitsHandOver = true
            outcomesAwaiting.value.jobs.append(progress)
            if !outcomesAwaiting.value.scheduled {
                outcomesAwaiting.value.scheduled = true
                apns.schedule(after: Self.outcomeInterval) { [self] in handOverOutcomes() }
            }
        }
    }

    /// Loop thread: the final outcomes gathered over the last interval go to the broker thread in one hand-over.
    private func handOverOutcomes() {
        var batches: [(jobID: String, outcomes: [SettledOutcome])] = []
        for progress in outcomesAwaiting.value.jobs where !progress.handedBack {
            progress.awaitsHandOver = false
            if let outcomes = progress.takeUnrecordedFinal() { batches.append((progress.job.id, outcomes)) }
        }
        outcomesAwaiting.value = ([], false)
        guard !batches.isEmpty else { return }
        finalOutcomes.withLock { $0.append(contentsOf: batches) }
        wakeup.signal()
    }
}

/// What the broker did not take (handed back: no queue; or refused), kept unacknowledged and published again after
/// a pause: finished jobs with everything they produce, and bad jobs to park. Bounded by the prefetch, as every one
/// of them is an unacknowledged delivery. A pause rather than at once, so that a queue someone deleted costs a
/// retry every few seconds (the broker adapter declares the queues again meanwhile), not a loop.
struct HeldPublishes {
    static let pause = 5.0

    private var jobs: [(progress: JobProgress, due: Date)] = []
    private var rejections: [(delivery: JobDelivery, reason: String, due: Date)] = []

    mutating func hold(job: JobProgress, now: Date = Date()) {
        jobs.append((job, now.addingTimeInterval(Self.pause)))
    }

    mutating func hold(rejection: (JobDelivery, String), now: Date = Date()) {
        rejections.append((rejection.0, rejection.1, now.addingTimeInterval(Self.pause)))
    }

    var nextDue: Date? { (jobs.map(\.due) + rejections.map(\.due)).min() }

    /// What is due now, taken out; nil if nothing is.
    mutating func takeDue(now: Date = Date()) -> (jobs: [JobProgress], rejections: [(JobDelivery, String)])? {
        guard let next = nextDue, next <= now else { return nil }
        let dueJobs = jobs.filter { $0.due <= now }.map(\.progress)
        let dueRejections = rejections.filter { $0.due <= now }.map { ($0.delivery, $0.reason) }
        jobs.removeAll { $0.due <= now }
        rejections.removeAll { $0.due <= now }
        return (dueJobs, dueRejections)
    }
}

/// Notifications waiting to be sent, first in first out, as (job, index) pairs: 16 bytes each, whatever the payload.
struct OutgoingQueue {
    private var entries: [(progress: JobProgress, index: Int32)] = []
    private var head = 0

    var count: Int { entries.count - head }
    var isEmpty: Bool { head == entries.count }

    mutating func append(_ progress: JobProgress, count: Int) {
        // No reserveCapacity: appending grows the storage geometrically, whereas reserving just what each job needed
        // copied the whole queue on every append (quadratic; with 500 fan-out jobs prefetched, nine page faults in
        // ten of the worker).
        for index in 0..<Int32(count) { entries.append((progress, index)) }
    }

    /// The next entries: up to `count` whose job's deadline (UNIX seconds) is later than `now`, and on the way every
    /// entry whose deadline has passed.
    mutating func take(upTo count: Int, liveAt now: Double)
        -> (live: [(progress: JobProgress, index: Int32)], expired: [(progress: JobProgress, index: Int32)]) {
        compact()
        var live: [(progress: JobProgress, index: Int32)] = []
        var expired: [(progress: JobProgress, index: Int32)] = []
        live.reserveCapacity(min(count, self.count))
        while live.count < count && head < entries.count {
            let entry = entries[head]
            head += 1
            if let deadline = entry.progress.job.deadline, Double(deadline) <= now {
                expired.append(entry)
            } else {
                live.append(entry)
            }
        }
        return (live, expired)
    }

    /// Entries just taken that could not go (the rate limit granted fewer) go back to the front, in their order.
    /// Only right after `take`: the slots before the head are still there until the next `take` compacts.
    mutating func putBack(_ returned: ArraySlice<(progress: JobProgress, index: Int32)>) {
        precondition(returned.count <= head, "putBack of more entries than were taken")
        head -= returned.count
        for (offset, entry) in returned.enumerated() { entries[head + offset] = entry }
    }

    /// Taken entries are dropped in bulk once they are half the storage, not one by one.
    private mutating func compact() {
        if head == entries.count {
            entries.removeAll(keepingCapacity: entries.count <= 65_536)
            head = 0
        } else if head >= entries.count / 2 {
            entries.removeFirst(head)
            head = 0
        }
    }
}

/// One outgoing queue per lane.
struct Backlogs {
    private var urgent = OutgoingQueue()
    private var bulk = OutgoingQueue()

    var counts: LaneCounts { LaneCounts(urgent: urgent.count, bulk: bulk.count) }

    /// Works on one lane's queue in place (no copy of its storage).
    mutating func withQueue<Result>(_ lane: JobLane, _ body: (inout OutgoingQueue) -> Result) -> Result {
        switch lane {
        case .urgent: body(&urgent)
        case .bulk: body(&bulk)
        }
    }
}
