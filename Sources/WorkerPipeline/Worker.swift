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

    public let configuration: WorkerConfiguration
    public let statistics = WorkerStatistics()
    private let logger: Logger
    private let apns: APNsClient
    private let completions = Locked<[JobProgress]>([])
    /// Final outcomes of jobs still under way, in batches, for the idempotency record (see `recordSent`).
    private let finalOutcomes = Locked<[(jobID: String, tokens: [String])]>([])
    /// Outcomes per job handed over at once: one Mutex round trip per this many notifications, not per notification.
    private static let outcomeBatch = 64
    private let wakeup = Wakeup()
    private let stopRequested = Atomic<Bool>(false)
    private let ready = Atomic<Bool>(false)

    public init(configuration: WorkerConfiguration, logger: Logger) throws(ConfigurationError) {
        self.configuration = configuration
        self.logger = logger
        let authentication = try configuration.makeAuthentication()
        if let problem = configuration.keyFilePermissionProblem() {
            logger.critical("the APNs private key is not private", ["file.problem": problem])
        }
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

    /// Whether the worker can work: consuming (connected to the broker and Redis) with an APNs connection open.
    public var isReady: Bool { ready.load(ordering: .relaxed) && statistics.openConnections > 0 }

    /// Asks `run()` to stop consuming, finish what is under way (up to SHUTDOWN_TIMEOUT) and return.
    public func stop() {
        stopRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// Runs until `stop()`; reconnects to the broker and Redis with back-off when they go away.
    public func run() {
        apns.connect(.production)
        var generation = 0
        var failures = 0
        var shared = statistics.snapshot()
        while !stopRequested.load(ordering: .acquiring) {
            generation += 1
            do {
                let session = try connect()
                failures = 0
                ready.store(true, ordering: .relaxed)
                try serve(session, generation: generation, sharedThrough: &shared)
                ready.store(false, ordering: .relaxed)
                break
            } catch {
                ready.store(false, ordering: .relaxed)
                failures += 1
                let delay = reconnectDelay(afterFailures: failures)
                logger.error("broker or Redis unavailable; reconnecting", ["error": "\(error)",
                                                                         "retry_in_s": String(format: "%.2f", delay)])
                wakeup.wait(timeout: delay)
            }
        }
        apns.shutdown()
        logger.info("worker stopped", ["stats": statistics.snapshot().summary])
    }

    private struct Session {
        let amqp: AMQPConnection
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

    private func connect() throws -> Session {
        let amqp = try AMQPConnection(url: configuration.amqpURL, heartbeat: configuration.amqpHeartbeat,
                                      caFile: configuration.amqpCAFile)
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
        try amqp.setPrefetch(configuration.prefetch)
        try amqp.enablePublisherConfirms()
        try amqp.consume(configuration.jobsQueue)
        let redis = try RedisConnection(url: configuration.redisURL)
        logger.info("consuming", ["amqp.queue": configuration.jobsQueue, "amqp.url": configuration.amqpURL.description,
                                  "amqp.local_port": String(amqp.localPort),
                                  "redis.url": configuration.redisURL.description,
                                  "amqp.prefetch": String(configuration.prefetch)])
        return Session(amqp: amqp, tokens: TokenCache(redis: redis, logger: logger),
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
                    try? session.sharedStatistics.report(now.subtracting(shared), worker: Self.identity)
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
            if !outcomes.isEmpty { try session.sentRecord.record(outcomes) }
            let current = finished.filter { $0.generation == generation }
            if !current.isEmpty {
                try finish(current, session: session)
                inFlight -= current.count
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
                    case .returned(let queue, let text):
                        logger.error("a publish was returned unroutable", ["amqp.queue": queue, "amqp.reply": text])
                    case .confirm:
                        break
                    }
                }
            }
            if !batch.isEmpty {
                inFlight += try start(batch, session: session, generation: generation, into: &backlog)
            }
            if !backlog.isEmpty && (nextWindowAt.map { Date() >= $0 } ?? true) {
                nextWindowAt = try send(&backlog, session: session).map { Date().addingTimeInterval($0) }
            }
            if !batch.isEmpty { continue }

            if Date().timeIntervalSince(lastShared) >= Self.reportInterval {
                let now = statistics.snapshot()
                try session.sharedStatistics.report(now.subtracting(shared), worker: Self.identity)
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
                wakeup.wait(alsoReadable: stopping ? nil : session.amqp.socketDescriptor,
                            timeout: min(1, nextWindowAt.map { max(0.001, $0.timeIntervalSinceNow) } ?? 1))
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
            let reservation = try rateLimit.reserve(wanted)
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
                       into backlog: inout OutgoingQueue) throws -> Int {
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
        // A redelivered job may have been under way when a worker died: skip what already had a final outcome.
        let redelivered = jobs.filter { $0.0.redelivered && Self.hasStableID($0.1, $0.0) }.map(\.1.id)
        let alreadySent = try session.sentRecord.sent(jobIDs: redelivered)

        var progresses: [JobProgress] = []
        var finishedAtOnce: [JobProgress] = []
        for (delivery, job) in jobs {
            var targets = job.retryTargets
                ?? Self.targets(of: job, resolved: resolved,
                                reaching: TopicMatcher(topic: job.topic, defaultTopic: configuration.defaultTopic))
            if let done = alreadySent[job.id], !done.isEmpty {
                let before = targets.count
                targets.removeAll { done.contains($0.token) }
                statistics.duplicatesAvoided.add(before - targets.count, ordering: .relaxed)
            }
            let progress = JobProgress(job: job, delivery: delivery, generation: generation, targets: targets,
                                       hasStableID: Self.hasStableID(job, delivery))
            progresses.append(progress)
            if targets.isEmpty {
                finishedAtOnce.append(progress)
                continue
            }
            backlog.append(progress, count: targets.count)
        }
        if !rejected.isEmpty { try reject(rejected, session: session) }
        if !finishedAtOnce.isEmpty { try finish(finishedAtOnce, session: session) }
        return progresses.count - finishedAtOnce.count
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

    /// Bad jobs go to PUSH_FAILED_QUEUE with their reason, confirmed, then acknowledged.
    private func reject(_ rejected: [(AMQPDelivery, String)], session: Session) throws {
        let amqp = session.amqp
        var last: UInt64 = 0
        var sequences: [UInt64] = []
        for (delivery, reason) in rejected {
            var properties = delivery.properties
            properties.persistent = true
            properties.headers[Self.reasonHeader] = reason
            last = try amqp.publish(to: configuration.failedQueue, body: delivery.body, properties: properties)
            sequences.append(last)
            logger.warning("job rejected", ["job.reason": reason, "amqp.delivery_tag": String(delivery.deliveryTag)])
        }
        let nacked = Set(try amqp.waitForConfirms(through: last))
        var settled: [UInt64] = []
        for ((delivery, _), sequence) in zip(rejected, sequences) {
            if nacked.contains(sequence) {
                try session.acknowledgements.requeue(delivery.deliveryTag)
            } else {
                settled.append(delivery.deliveryTag)
                statistics.jobsRejected.add(1, ordering: .relaxed)
            }
        }
        try session.acknowledgements.acknowledge(settled)
    }

    /// Publishes what finished jobs produced (dead-token events, parked jobs, summaries), waits for the broker's
    /// confirms, takes the dead tokens out of the cache, then acknowledges the jobs. A job whose publishes were not
    /// confirmed is requeued, not acknowledged. The order makes a crash repeat work, never lose an event: a token
    /// leaves the cache only once its event is safe with the broker.
    private func finish(_ finished: [JobProgress], session: Session) throws {
        let amqp = session.amqp
        var ranges: [ClosedRange<UInt64>?] = []
        var last: UInt64 = 0
        for progress in finished {
            settleTokenMismatches(progress)
            let first = amqp.upcomingPublishSequence
            for (target, response) in progress.dead {
                let event = DeadTokenEvent(token: target.token, user: target.user, topic: progress.job.topic,
                                           environment: target.environment, status: response.status,
                                           reason: response.reason?.rawValue ?? "", timestamp: response.timestamp,
                                           jobID: progress.job.id)
                last = try amqp.publish(to: configuration.deadTokensQueue, exchange: configuration.deadTokensExchange,
                                        body: event.json)
            }
            let retrying = !progress.retryable.isEmpty && progress.job.attempt < configuration.maximumSendAttempts
            if retrying {
                // Another attempt waits in a delay queue that dead-letters back to the jobs queue: nothing is held
                // here, and the retry survives this worker.
                let delay = progress.retryable.map(\.delay).max() ?? 0
                var properties = progress.delivery.properties
                properties.persistent = true
                properties.headers[Self.reasonHeader] = progress.retryable[0].reason
                last = try amqp.publish(to: retryQueue(attempt: progress.job.attempt, suggestedDelay: delay),
                                        body: progress.job.retryBody(targets: progress.retryable.map(\.target)),
                                        properties: properties)
            } else if let first = progress.retryable.first {
                var properties = progress.delivery.properties
                properties.persistent = true
                properties.headers[Self.reasonHeader] =
                    "\(progress.retryable.count) of \(progress.targets.count) notifications not delivered after "
                    + "\(progress.job.attempt) attempts: \(first.reason)"
                last = try amqp.publish(to: configuration.failedQueue, body: progress.delivery.body, properties: properties)
            }
            if let replyTo = progress.delivery.properties.replyTo, !replyTo.isEmpty {
                last = try amqp.publish(to: replyTo, body: progress.summaryJSON(retrying: retrying),
                                        properties: AMQPProperties(correlationID: progress.delivery.properties.correlationID
                                                                   ?? progress.job.id, persistent: false))
            }
            let end = amqp.upcomingPublishSequence
            ranges.append(end > first ? first...(end - 1) : nil)
        }
        let nacked = last > 0 ? Set(try amqp.waitForConfirms(through: last)) : []
        let confirmed = zip(finished, ranges).filter { _, range in !(range.map { $0.contains(where: nacked.contains) } ?? false) }
        // Only an entry that still serves the job's topic in that environment goes: a token registered since for
        // another kind or app is someone else's. Tokens sent directly are left to the cleanup consumer's events.
        try session.tokens.remove(confirmed.flatMap { progress, _ in
            let matcher = TopicMatcher(topic: progress.job.topic, defaultTopic: configuration.defaultTopic)
            return progress.dead.compactMap { dead in
                dead.target.user.map { user in
                    TokenRemoval(user: user, token: dead.target.token, unlessRegisteredAfter: dead.response.timestamp,
                                 onlyIfValueIn: matcher.cacheValues(in: dead.target.environment))
                }
            }
        })
        var completed: [UInt64] = []
        completed.reserveCapacity(finished.count)
        for (progress, range) in zip(finished, ranges) {
            if let range, range.contains(where: nacked.contains) {
                logger.error("broker refused a publish; the job will be redelivered", ["job.id": progress.job.id])
                try session.acknowledgements.requeue(progress.delivery.deliveryTag)
                continue
            }
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
    }

    /// The mass-invalidation guard, once a job's outcomes are all in: its 400 mismatch answers either count as dead
    /// tokens (removed, with events) or, when they look like a configuration mistake, are held back, logged at error
    /// level and counted. 410s are never held back.
    private func settleTokenMismatches(_ progress: JobProgress) {
        let held = progress.applyGuard(configuration.invalidationGuard)
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

    // MARK: APNs loop thread

    private func record(_ result: APNsResult, for progress: JobProgress, _ index: Int) {
        if result.response != nil { progress.countAnswer() }
        if result.outcome != .delivered {
            // Without an answer, the reason is a fixed word: error texts vary and would make endless label values.
            statistics.countUnsuccessful(status: result.response?.status, reason: result.response?.reason?.rawValue
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
            let reason = result.response?.reason?.rawValue ?? result.error ?? "status \(result.response?.status ?? 0)"
            progress.recordFailed(index, reason: reason)
            statistics.permanentFailures.add(1, ordering: .relaxed)
            logger.warning("notification failed", ["job.id": progress.job.id, "apns.reason": reason,
                                                   "apns.status": String(result.response?.status ?? 0),
                                                   "apns.token": Redact.token(progress.targets[index].token)])
        case .retryLater(let suggested):
            progress.recordRetryable(index, reason: result.response?.reason?.rawValue ?? result.error ?? "retry later",
                                     delay: suggested)
        case .refreshTokenAndRetry, .replaceConnectionAndRetry:
            progress.recordRetryable(index, reason: result.response?.reason?.rawValue ?? "provider token", delay: 1)
        }
        if progress.isComplete {
            completions.withLock { $0.append(progress) }
            wakeup.signal()
        } else if let tokens = progress.takeUnrecordedFinal(atLeast: Self.outcomeBatch) {
            finalOutcomes.withLock { $0.append((progress.job.id, tokens)) }
            wakeup.signal()
        }
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
