import AMQP
import APNs
import Foundation
import Redis
import Synchronization
import Telemetry

/// The worker: consumes jobs, resolves their users, sends their notifications, publishes what came of them, and
/// acknowledges each job once every one of its notifications has a final outcome.
///
/// Threads: `run()` is the broker thread; it alone owns the AMQP and Redis connections (blocking C clients). The
/// APNs client's loop thread owns the HTTP/2 connections and every job's progress while its notifications are out.
/// Work crosses between the two in batches: a consumed batch goes out in one `send`; finished jobs come back
/// through `completions` with one wake-up.
public final class Worker: Sendable {
    public static let reasonHeader = "x-apns-worker-reason"
    /// On a job parked after its last attempt: how many attempts were made, and the device tokens still undelivered
    /// (comma-separated, the first `undeliveredListed` of them).
    public static let attemptsHeader = "x-apns-worker-attempts"
    public static let undeliveredHeader = "x-apns-worker-undelivered"
    static let undeliveredListed = 100

    public let configuration: WorkerConfiguration
    public let statistics = WorkerStatistics()
    private let logger: Logger
    private let apns: APNsClient
    private let completions = Locked<[JobProgress]>([])
    /// Final outcomes of jobs still under way, in batches, for the idempotency record (see `recordSent`).
    private let finalOutcomes = Locked<[(jobID: String, tokens: [String])]>([])
    /// Final outcomes go to the idempotency record at least this often (seconds): a crash sends again what was
    /// unanswered plus at most this much of answers. One hand-over per interval, not one per answer.
    static let outcomeInterval = 0.01
    /// Loop thread only: jobs with final outcomes not handed over yet, and whether a hand-over is scheduled.
    private let outcomesAwaiting = LoopConfined<(jobs: [JobProgress], scheduled: Bool)>(([], false))
    private let wakeup = Wakeup()
    private let stopRequested = Atomic<Bool>(false)
    private let ready = Atomic<Bool>(false)
    /// When the broker and Redis last answered a round trip (monotonic nanoseconds), probed every second.
    private let lastAlive = Atomic<UInt64>(0)
    static let probeInterval = 1.0
    /// /readyz says not ready once the broker or Redis has not answered for this long.
    static let readinessWindow = 3.0

    public init(configuration: WorkerConfiguration, logger: Logger) throws(ConfigurationError) {
        self.configuration = configuration
        self.logger = logger
        let authentication = try configuration.makeAuthentication()
        if let problem = configuration.keyFilePermissionProblem() {
            logger.critical("the APNs private key is not private", ["file.problem": problem])
        }
        if let choice = configuration.credentialChoice { logger.warning("two APNs credentials", ["apns.credentials": choice]) }
        var apnsConfiguration = configuration.apns
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

    /// Whether the worker can work now: consuming, the broker and Redis answering (a round trip within the last
    /// `readinessWindow` seconds), and an APNs connection open.
    public var isReady: Bool {
        let sinceAlive = Double(DispatchTime.now().uptimeNanoseconds &- lastAlive.load(ordering: .relaxed)) / 1e9
        return ready.load(ordering: .relaxed) && sinceAlive < Self.readinessWindow && statistics.openConnections > 0
    }

    /// Asks `run()` to stop consuming, finish what is under way (up to SHUTDOWN_TIMEOUT) and return.
    public func stop() {
        stopRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// Runs until `stop()`; reconnects to the broker and Redis with back-off when they go away. Only connection
    /// failures reach here: a data error (a key of the wrong type, a bad job) is settled where it concerns one user,
    /// token or job, and the rest of the batch proceeds. Before the first connection succeeds, a refusal that
    /// waiting cannot cure (wrong credentials, an unknown vhost or database) throws instead; a broker or Redis that is
    /// merely down is waited for.
    public func run() throws(StartupError) {
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
                ready.store(true, ordering: .relaxed)
                try serve(session, generation: generation, sharedThrough: &shared)
                ready.store(false, ordering: .relaxed)
                break
            } catch {
                ready.store(false, ordering: .relaxed)
                if !connectedOnce, let problem = StartupError(permanent: error) {
                    apns.shutdown()
                    throw problem
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

    private struct Session {
        let amqp: AMQPConnection
        let redis: RedisConnection
        let tokens: TokenCache
        let rateLimit: SharedRateLimit?
        let sentRecord: SentRecord
        let sharedStatistics: SharedStatistics
        let acknowledgements: Acknowledgements
    }

    /// How this process appears in `apns:workers` and in `apns-worker stats`.
    public static let identity = "\(ProcessInfo.processInfo.hostName):\(getpid())"
    /// Seconds between two reports to the shared statistics in Redis.
    private static let reportInterval = 5.0


    /// Jobs that name themselves (an `id` in the body, or an AMQP message-id) can be recognised when redelivered;
    /// a delivery tag changes with every delivery.
    private static func hasStableID(_ job: PushJob, _ delivery: AMQPDelivery) -> Bool {
        job.idFromBody || delivery.properties.messageID != nil
    }

    /// The delay queue for a retry: the tier for this attempt, or a longer one if APNs asked for a longer wait.
    private func retryQueue(attempt: Int, suggestedDelay: Double) -> String {
        let delays = configuration.retryDelays
        let byAttempt = min(attempt - 1, delays.count - 1)
        let bySuggestion = delays.firstIndex { $0 >= suggestedDelay } ?? delays.count - 1
        return Self.retryQueueName(jobsQueue: configuration.jobsQueue, delay: delays[max(byAttempt, bySuggestion)])
    }

    /// `<jobs queue>.retry.<ms>ms`: messages wait there `ms` milliseconds, then dead-letter back to the jobs queue.
    public static func retryQueueName(jobsQueue: String, delay: Double) -> String {
        "\(jobsQueue).retry.\(Int((delay * 1000).rounded()))ms"
    }

    /// The queues and the exchange the worker uses: declared at every connect, and again when one went missing.
    private func declareTopology(on amqp: AMQPConnection) throws {
        for queue in [configuration.jobsQueue, configuration.failedQueue] {
            try amqp.declareQueue(queue)
        }
        try Topology.declareDeadTokens(on: amqp, configuration)
        for delay in configuration.retryDelays {
            try amqp.declareQueue(Self.retryQueueName(jobsQueue: configuration.jobsQueue, delay: delay), arguments: [
                "x-message-ttl": .integer(Int64((delay * 1000).rounded())),
                "x-dead-letter-exchange": .string(""),
                "x-dead-letter-routing-key": .string(configuration.jobsQueue),
            ])
        }
    }

    private func connect() throws -> Session {
        let amqp = try AMQPConnection(url: configuration.amqpURL, heartbeat: configuration.amqpHeartbeat,
                                      caFile: configuration.amqpCAFile)
        try declareTopology(on: amqp)
        try amqp.setPrefetch(configuration.prefetch)
        try amqp.enablePublisherConfirms()
        try amqp.consume(configuration.jobsQueue)
        let redis = try RedisConnection(url: configuration.redisURL)
        lastAlive.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed)
        logger.info("consuming", ["amqp.queue": configuration.jobsQueue, "amqp.url": configuration.amqpURL.description,
                                  "amqp.local_port": String(amqp.localPort),
                                  "redis.url": configuration.redisURL.description,
                                  "amqp.prefetch": String(configuration.prefetch)])
        return Session(amqp: amqp, redis: redis, tokens: TokenCache(redis: redis, logger: logger),
                       rateLimit: configuration.rateLimit > 0 ? SharedRateLimit(redis: redis, limit: configuration.rateLimit) : nil,
                       sentRecord: SentRecord(redis: redis), sharedStatistics: SharedStatistics(redis: redis),
                       acknowledgements: Acknowledgements(amqp: amqp))
    }

    // MARK: broker thread

    /// `sharedThrough`: the counters already added to the shared statistics in Redis.
    private func serve(_ session: Session, generation: Int, sharedThrough shared: inout WorkerStatistics.Snapshot) throws {
        var inFlight = 0
        var stopDeadline: Date?
        var lastSummary = Date()
        var lastReported = statistics.snapshot()
        var lastShared = Date.distantPast
        // Notifications waiting for room in flight or for rate-limit permits; bounded by the prefetch, as their jobs
        // are unacknowledged. Each is its job and index: the request is built only when it goes out.
        var backlog = OutgoingQueue()
        var nextWindowAt: Date?
        var held = HeldPublishes()
        var lastProbe = Date()
        while true {
            let stopping = stopRequested.load(ordering: .acquiring)
            if stopping {
                if stopDeadline == nil {
                    stopDeadline = Date().addingTimeInterval(configuration.shutdownTimeout)
                    logger.info("stopping: finishing jobs under way", ["jobs.in_flight": String(inFlight)])
                }
                if inFlight == 0 || Date() > stopDeadline! {
                    if inFlight > 0 {
                        logger.warning("shutdown deadline passed; the broker will redeliver unfinished jobs",
                                       ["jobs.in_flight": String(inFlight)])
                    }
                    let now = statistics.snapshot()
                    _ = try? session.sharedStatistics.report(now.subtracting(shared), worker: Self.identity)
                    shared = now
                    session.amqp.close()
                    return
                }
            }

            let finished = completions.withLock { queue -> [JobProgress] in
                defer { queue.removeAll(keepingCapacity: true) }
                return queue
            }
            let outcomes = finalOutcomes.withLock { queue -> [(jobID: String, tokens: [String])] in
                defer { queue.removeAll(keepingCapacity: true) }
                return queue
            }
            if !outcomes.isEmpty { try record(outcomes, session: session) }
            let current = finished.filter { $0.generation == generation }
            if !current.isEmpty {
                inFlight -= try finish(current, session: session, held: &held)
            }
            if let due = held.takeDue() {
                if !due.jobs.isEmpty { inFlight -= try finish(due.jobs, session: session, held: &held) }
                if !due.rejections.isEmpty { try reject(due.rejections, session: session, held: &held) }
            }

            var batch: [AMQPDelivery] = []
            if !stopping {
                while batch.count < configuration.prefetch, let event = try session.amqp.nextEvent(timeout: 0) {
                    switch event {
                    case .delivery(let delivery):
                        session.acknowledgements.received(delivery.deliveryTag)
                        batch.append(delivery)
                    case .blocked(let blocked):
                        logger.warning(blocked ? "broker blocks publishers (resource alarm)" : "broker unblocked")
                        statistics.brokerBlocked.store(blocked, ordering: .relaxed)
                        if blocked { statistics.brokerBlocks.add(1, ordering: .relaxed) }
                    case .confirm:
                        break
                    }
                }
            }
            if !batch.isEmpty {
                inFlight += try start(batch, session: session, generation: generation, into: &backlog, held: &held)
            }
            if !backlog.isEmpty && (nextWindowAt.map { Date() >= $0 } ?? true) {
                nextWindowAt = try send(&backlog, session: session).map { Date().addingTimeInterval($0) }
            }
            if Date().timeIntervalSince(lastProbe) >= Self.probeInterval {
                // Readiness is the broker and Redis as they are now: a round trip to each. One that does not answer
                // within its timeout ends this session (reconnect); meanwhile /readyz goes stale.
                try session.redis.ping()
                _ = try session.amqp.queueStatus(configuration.jobsQueue)
                lastAlive.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed)
                lastProbe = Date()
            }
            if !batch.isEmpty { continue }

            if Date().timeIntervalSince(lastShared) >= Self.reportInterval {
                let now = statistics.snapshot()
                if let refused = try session.sharedStatistics.report(now.subtracting(shared), worker: Self.identity) {
                    statistics.countDataError("statistics")
                    logger.warning("Redis refused the shared statistics", ["redis.error": refused])
                }
                shared = now
                lastShared = Date()
            }
            let sinceSummary = Date().timeIntervalSince(lastSummary)
            if sinceSummary >= 10 {
                let now = statistics.snapshot()
                if now != lastReported {
                    let answered = now.subtracting(lastReported)
                    let rate = Double(answered.delivered + answered.deadTokens + answered.permanentFailures) / sinceSummary
                    logger.info("progress", ["stats": now.summary, "jobs.in_flight": String(inFlight),
                                             "notifications_per_s": String(Int(rate.rounded())),
                                             "apns.in_flight": String(statistics.inFlight.load(ordering: .relaxed))])
                    lastReported = now
                }
                lastSummary = Date()
            }
            if !session.amqp.hasBufferedInput {
                // While stopping, deliveries are left unread (the broker requeues them), so only wake-ups count.
                let wakeAt = [nextWindowAt, held.nextDue].compactMap { $0 }.min()
                wakeup.wait(alsoReadable: stopping ? nil : session.amqp.socketDescriptor,
                            timeout: min(1, wakeAt.map { max(0.001, $0.timeIntervalSinceNow) } ?? 1))
            }
        }
    }

    /// Sends what fits in flight (WORKER_MAX_IN_FLIGHT) and what the shared rate limit allows now, in one call;
    /// returns the seconds until more may go, if the rate limit makes them wait. When answers bring the count in
    /// flight down to half the limit, the loop thread wakes this thread to send more.
    private func send(_ backlog: inout OutgoingQueue, session: Session) throws -> Double? {
        var count = min(backlog.count, configuration.maxInFlight - statistics.inFlight.load(ordering: .relaxed))
        guard count > 0 else { return nil }
        var wait: Double?
        if let rateLimit = session.rateLimit {
            let wanted = count
            let reservation: (granted: Int, nextWindowIn: Double)
            do { reservation = try rateLimit.reserve(wanted) } catch {
                guard error.kind == .server else { throw error }
                // Redis refused the script (a slot key of the wrong type): nothing goes out unmetered; the slot keys
                // expire within 10 s, so waiting a second and asking again is enough.
                statistics.countDataError("rate_limit")
                logger.error("Redis refused the rate-limit reservation; waiting", ["redis.error": error.message])
                return 1
            }
            count = reservation.granted
            if count < wanted {
                wait = reservation.nextWindowIn
                statistics.rateLimitWaits.add(1, ordering: .relaxed)
            }
        }
        guard count > 0 else { return wait }
        let sending = backlog.take(count)
        statistics.inFlight.add(count, ordering: .relaxed)
        let lowWater = configuration.maxInFlight / 2
        let handedOver = DispatchTime.now().uptimeNanoseconds
        apns.send(sending.map { $0.progress.notification(Int($0.index)) }) { [self] position, result in
            statistics.apnsLatency.observe(nanoseconds: DispatchTime.now().uptimeNanoseconds &- handedOver)
            if statistics.inFlight.subtract(1, ordering: .relaxed).newValue == lowWater { wakeup.signal() }
            let (progress, index) = sending[position]
            record(result, for: progress, Int(index))
        }
        return wait
    }

    /// Decodes a batch, rejects the bad jobs, resolves users in one Redis round trip and queues every notification
    /// for sending. Returns how many jobs are now waiting for outcomes.
    private func start(_ batch: [AMQPDelivery], session: Session, generation: Int,
                       into backlog: inout OutgoingQueue, held: inout HeldPublishes) throws -> Int {
        var rejected: [(AMQPDelivery, String)] = []
        var jobs: [(AMQPDelivery, PushJob)] = []
        for delivery in batch {
            let fallbackID = delivery.properties.messageID ?? "delivery-\(delivery.deliveryTag)"
            do {
                jobs.append((delivery, try PushJob.decode(delivery.body, defaultTopic: configuration.defaultTopic,
                                                          fallbackID: fallbackID)))
            } catch {
                rejected.append((delivery, error.description))
            }
        }
        let resolved = try session.tokens.resolve(jobs.flatMap { $0.1.retryTargets == nil ? $0.1.users : [] })
        statistics.countDataError("token_cache_read", resolved.unreadable.count)
        // A redelivered job may have been under way when a worker died: skip what already had a final outcome.
        let redelivered = jobs.filter { $0.0.redelivered && Self.hasStableID($0.1, $0.0) }.map(\.1.id)
        let (alreadySent, unreadableRecords) = try session.sentRecord.sent(jobIDs: redelivered)
        for (jobID, message) in unreadableRecords {
            statistics.countDataError("idempotency_record")
            logger.error("the idempotency record cannot be read; the redelivered job is sent whole",
                         ["job.id": jobID, "redis.key": SentRecord.key(forJob: jobID), "redis.error": message])
        }

        var progresses: [JobProgress] = []
        var finishedAtOnce: [JobProgress] = []
        for (delivery, job) in jobs {
            var targets = job.retryTargets
                ?? Self.targets(of: job, resolved: resolved.tokens,
                                reaching: TopicMatcher(topic: job.topic, defaultTopic: configuration.defaultTopic))
            let settled = alreadySent[job.id]
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
            backlog.append(progress, count: targets.count)
        }
        if !rejected.isEmpty { try reject(rejected, session: session, held: &held) }
        let settled = finishedAtOnce.isEmpty ? 0 : try finish(finishedAtOnce, session: session, held: &held)
        return progresses.count - settled
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

    /// Bad jobs go to PUSH_FAILED_QUEUE with their reason, confirmed, then acknowledged. One the broker hands back
    /// (the failed queue was deleted) or refuses stays unacknowledged and is parked again after a pause.
    private func reject(_ rejected: [(AMQPDelivery, String)], session: Session, held: inout HeldPublishes) throws {
        let amqp = session.amqp
        var last: UInt64 = 0
        var sequences: [UInt64] = []
        for (delivery, reason) in rejected {
            var properties = delivery.properties
            properties.persistent = true
            properties.headers[Self.reasonHeader] = reason
            last = try amqp.publish(to: configuration.failedQueue, body: delivery.body, properties: properties,
                                    mandatory: true)
            sequences.append(last)
            logger.warning("job rejected", ["job.reason": reason, "amqp.delivery_tag": String(delivery.deliveryTag)])
        }
        let nacked = Set(try amqp.waitForConfirms(through: last))
        let returned = try handBacks(amqp.takeReturns(), session: session)
        let parkingRefused = !returned.isEmpty || !nacked.isEmpty
        var settled: [UInt64] = []
        for ((delivery, reason), sequence) in zip(rejected, sequences) {
            if nacked.contains(sequence) || returned.contains(Destination(exchange: "", routingKey: configuration.failedQueue)) {
                held.hold(rejection: (delivery, reason))
                statistics.countRefusedPublish("rejected_job")
            } else {
                settled.append(delivery.deliveryTag)
                statistics.jobsRejected.add(1, ordering: .relaxed)
            }
        }
        if parkingRefused && settled.count < rejected.count {
            logger.error("the broker did not take parked jobs; kept unacknowledged, parked again shortly",
                         ["amqp.queue": configuration.failedQueue, "jobs": String(rejected.count - settled.count),
                          "retry_in_s": String(HeldPublishes.pause)])
        }
        try session.acknowledgements.acknowledge(settled)
    }

    /// Where a publish went: the exchange and the routing key, as a return names them.
    struct Destination: Hashable {
        var exchange: String
        var routingKey: String
    }

    /// Logs and counts what the broker handed back, and declares the worker's queues again if one of its own went
    /// missing (deleted at run time), so that the next attempt finds it. Returns the destinations handed back.
    private func handBacks(_ returns: [AMQPReturn], session: Session) throws -> Set<Destination> {
        guard !returns.isEmpty else { return [] }
        let destinations = Set(returns.map { Destination(exchange: $0.exchange, routingKey: $0.routingKey) })
        let own = ownDestinations
        for destination in destinations where own.contains(destination) {
            logger.error("the broker handed back a publish: no queue took it; declaring the worker's queues again",
                         ["amqp.exchange": destination.exchange, "amqp.routing_key": destination.routingKey,
                          "amqp.reply": returns.first { $0.routingKey == destination.routingKey }?.replyText ?? ""])
        }
        if !destinations.isDisjoint(with: own) { try declareTopology(on: session.amqp) }
        return destinations
    }

    /// The destinations of what must not be lost: dead-token events, parked jobs, retries.
    private var ownDestinations: Set<Destination> {
        var destinations: Set<Destination> = [Destination(exchange: configuration.deadTokensExchange,
                                                          routingKey: configuration.deadTokensQueue),
                                              Destination(exchange: "", routingKey: configuration.failedQueue)]
        for delay in configuration.retryDelays {
            destinations.insert(Destination(exchange: "", routingKey: Self.retryQueueName(jobsQueue: configuration.jobsQueue,
                                                                                          delay: delay)))
        }
        return destinations
    }

    /// Publishes what finished jobs produced (dead-token events, parked jobs, retries, summaries), waits for the
    /// broker's confirms, takes the dead tokens out of the cache, then acknowledges the jobs. Returns how many jobs
    /// it settled.
    ///
    /// Events, parked jobs and retries are published mandatory: one the broker hands back (its queue was deleted)
    /// or refuses (nacks) leaves its job unacknowledged and held, and its publishes are made again after a pause
    /// (`HeldPublishes`), so nothing is acknowledged that was not published. A summary to a `reply_to` queue that
    /// does not exist is logged; it holds nothing up. The order makes a crash repeat work, never lose an event: a
    /// token leaves the cache only once its event is safe with the broker.
    private func finish(_ finished: [JobProgress], session: Session, held: inout HeldPublishes) throws -> Int {
        let amqp = session.amqp
        var ranges: [ClosedRange<UInt64>?] = []
        var destinations: [Set<Destination>] = []
        var last: UInt64 = 0
        for progress in finished {
            settleTokenMismatches(progress)
            let first = amqp.upcomingPublishSequence
            var kept = Set<Destination>()
            for (target, response) in progress.dead {
                let event = DeadTokenEvent(token: target.token, user: target.user, topic: progress.job.topic,
                                           environment: target.environment, status: response.status,
                                           reason: response.reason?.label ?? "", timestamp: response.timestamp,
                                           jobID: progress.job.id)
                last = try amqp.publish(to: configuration.deadTokensQueue, exchange: configuration.deadTokensExchange,
                                        body: event.json, mandatory: true)
                kept.insert(Destination(exchange: configuration.deadTokensExchange, routingKey: configuration.deadTokensQueue))
            }
            let retrying = !progress.retryable.isEmpty && progress.job.attempt < configuration.maximumSendAttempts
            if retrying {
                // Another attempt waits in a delay queue that dead-letters back to the jobs queue: nothing is held
                // here, and the retry survives this worker.
                let delay = progress.retryable.map(\.delay).max() ?? 0
                var properties = progress.delivery.properties
                properties.persistent = true
                properties.headers[Self.reasonHeader] = progress.retryable[0].reason
                let queue = retryQueue(attempt: progress.job.attempt, suggestedDelay: delay)
                last = try amqp.publish(to: queue, body: progress.job.retryBody(targets: progress.retryable.map(\.target),
                                                                                original: progress.delivery.body),
                                        properties: properties, mandatory: true)
                kept.insert(Destination(exchange: "", routingKey: queue))
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
                last = try amqp.publish(to: configuration.failedQueue,
                                        body: progress.job.originalBody ?? progress.delivery.body,
                                        properties: properties, mandatory: true)
                kept.insert(Destination(exchange: "", routingKey: configuration.failedQueue))
                logger.error("job parked after its last attempt", ["job.id": progress.job.id, "job.reason": reason,
                                                                   "amqp.queue": configuration.failedQueue])
            }
            if let replyTo = progress.delivery.properties.replyTo, !replyTo.isEmpty {
                last = try amqp.publish(to: replyTo, body: progress.summaryJSON(retrying: retrying),
                                        properties: AMQPProperties(correlationID: progress.delivery.properties.correlationID
                                                                   ?? progress.job.id, persistent: false),
                                        mandatory: true)
            }
            let end = amqp.upcomingPublishSequence
            ranges.append(end > first ? first...(end - 1) : nil)
            destinations.append(kept)
        }
        let nacked = last > 0 ? Set(try amqp.waitForConfirms(through: last)) : []
        let returned = try handBacks(amqp.takeReturns(), session: session)
        var confirmed: [JobProgress] = []
        var refused: [JobProgress] = []
        for ((progress, range), kept) in zip(zip(finished, ranges), destinations) {
            if let range, range.contains(where: nacked.contains) || !kept.isDisjoint(with: returned) {
                refused.append(progress)
                continue
            }
            confirmed.append(progress)
            if let replyTo = progress.delivery.properties.replyTo,
               returned.contains(Destination(exchange: "", routingKey: replyTo)) {
                statistics.countRefusedPublish("summary")
                logger.warning("a job's summary was handed back: no queue named by its reply_to",
                               ["job.id": progress.job.id, "amqp.reply_to": replyTo])
            }
        }
        // Only an entry that still serves the job's topic in that environment goes: a token registered since for
        // another kind or app is someone else's. Tokens sent directly are left to the cleanup consumer's events.
        let removals = confirmed.flatMap { progress in
            let matcher = TopicMatcher(topic: progress.job.topic, defaultTopic: configuration.defaultTopic)
            return progress.dead.compactMap { dead in
                dead.target.user.map { user in
                    (progress.job.id, TokenRemoval(user: user, token: dead.target.token,
                                                   unlessRegisteredAfter: dead.response.timestamp,
                                                   onlyIfValueIn: matcher.cacheValues(in: dead.target.environment)))
                }
            }
        }
        // A removal Redis refuses (a key of the wrong type) concerns that token only: its event is out, the job is
        // settled, and the cleanup consumer will meet the same key and park the event with the reason.
        for ((jobID, removal), change) in zip(removals, try session.tokens.remove(removals.map(\.1))) {
            guard case .failed(let message) = change else { continue }
            statistics.countDataError("token_removal")
            logger.error("Redis refused to remove a dead token", ["job.id": jobID, "user": removal.user,
                                                                  "apns.token": Redact.token(removal.token),
                                                                  "redis.error": message])
        }
        // A held job's outcomes go to the idempotency record now: if this connection drops before its publishes are
        // made again, its redelivery sends nothing twice and still publishes its dead tokens' events.
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
            completed.append(progress.delivery.deliveryTag)
            statistics.jobsCompleted.add(1, ordering: .relaxed)
            if !progress.retryable.isEmpty {
                if progress.job.attempt < configuration.maximumSendAttempts {
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
        try session.acknowledgements.acknowledge(completed)
        return confirmed.count
    }

    /// The mass-invalidation guard, once a job's outcomes are all in: its 400 mismatch answers either count as dead
    /// tokens (removed, with events) or, when they look like a configuration mistake, are held back, logged at error
    /// level and counted. 410s are never held back.
    private func settleTokenMismatches(_ progress: JobProgress) {
        guard let held = progress.applyGuard(configuration.invalidationGuard) else { return }
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

    /// Adds final outcomes to the idempotency record. A record Redis refuses concerns that job only: logged and
    /// counted (a redelivery of it would send its notifications again), never a reconnect.
    private func record(_ outcomes: [(jobID: String, tokens: [String])], session: Session) throws {
        for (jobID, message) in try session.sentRecord.record(outcomes) {
            statistics.countDataError("idempotency_record")
            logger.error("Redis refused the idempotency record", ["job.id": jobID, "redis.key": SentRecord.key(forJob: jobID),
                                                                  "redis.error": message])
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
        var batches: [(jobID: String, tokens: [String])] = []
        for progress in outcomesAwaiting.value.jobs where !progress.handedBack {
            progress.awaitsHandOver = false
            if let tokens = progress.takeUnrecordedFinal() { batches.append((progress.job.id, tokens)) }
        }
        outcomesAwaiting.value = ([], false)
        guard !batches.isEmpty else { return }
        finalOutcomes.withLock { $0.append(contentsOf: batches) }
        wakeup.signal()
    }
}

/// What the broker did not take (handed back: no queue; or nacked), kept unacknowledged and published again after a
/// pause: finished jobs with everything they produce, and bad jobs to park. Bounded by the prefetch, as every one
/// of them is an unacknowledged delivery. A pause rather than at once, so that a queue someone deleted costs a
/// retry every few seconds (the worker declares its queues again meanwhile), not a loop.
struct HeldPublishes {
    static let pause = 5.0

    private var jobs: [(progress: JobProgress, due: Date)] = []
    private var rejections: [(delivery: AMQPDelivery, reason: String, due: Date)] = []

    mutating func hold(job: JobProgress, now: Date = Date()) {
        jobs.append((job, now.addingTimeInterval(Self.pause)))
    }

    mutating func hold(rejection: (AMQPDelivery, String), now: Date = Date()) {
        rejections.append((rejection.0, rejection.1, now.addingTimeInterval(Self.pause)))
    }

    var nextDue: Date? { (jobs.map(\.due) + rejections.map(\.due)).min() }

    /// What is due now, taken out; nil if nothing is.
    mutating func takeDue(now: Date = Date()) -> (jobs: [JobProgress], rejections: [(AMQPDelivery, String)])? {
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

    /// The next `count` entries; taken ones are dropped in bulk once they are half the storage, not one by one.
    mutating func take(_ count: Int) -> [(progress: JobProgress, index: Int32)] {
        let taken = Array(entries[head..<(head + count)])
        head += count
        if head == entries.count {
            entries.removeAll(keepingCapacity: entries.count <= 65_536)
            head = 0
        } else if head >= entries.count / 2 {
            entries.removeFirst(head)
            head = 0
        }
        return taken
    }
}
