import AMQP
import AMQPBroker
import Configuration
import Foundation
import Redis
import RedisStore
import Synchronization
import Telemetry
import Threads
import WorkerPipeline

/// `apns-worker cleanup`: keeps the token cache true to what APNs and the apps say.
/// - consumes PUSH_DEAD_TOKENS_QUEUE and takes each dead token out of the cache, unless the app registered it again
///   after the event's timestamp (the worker does the same for its own users; this also covers tokens sent
///   directly, through `apns:owner:<token>`, and events other systems publish);
/// - consumes PUSH_REGISTRATIONS_QUEUE and applies each registration (newer than what is known) or unregistration;
/// - sweeps, every CLEANUP_SWEEP_INTERVAL, the tokens no app registered for CLEANUP_INACTIVE_DAYS.
/// Messages are acknowledged only after Redis applied them; a bad message is parked on PUSH_FAILED_QUEUE with the
/// reason in the `x-apns-worker-reason` header, like a bad job.
public final class TokenCleanup: Service {
    public final class Statistics: Sendable {
        public let deadTokensRemoved = Atomic<Int>(0)
        /// Dead-token events for tokens already gone or registered again since.
        public let deadTokensKept = Atomic<Int>(0)
        public let registrationsApplied = Atomic<Int>(0)
        /// Registrations older than what the cache knows (arrived out of order).
        public let registrationsStale = Atomic<Int>(0)
        public let unregistrations = Atomic<Int>(0)
        public let refused = Atomic<Int>(0)
        public let sweptTokens = Atomic<Int>(0)
        public let sweeps = Atomic<Int>(0)

        public var summary: String {
            "dead_removed=\(deadTokensRemoved.load(ordering: .relaxed)) dead_kept=\(deadTokensKept.load(ordering: .relaxed)) "
                + "registered=\(registrationsApplied.load(ordering: .relaxed)) "
                + "stale=\(registrationsStale.load(ordering: .relaxed)) unregistered=\(unregistrations.load(ordering: .relaxed)) "
                + "refused=\(refused.load(ordering: .relaxed)) swept=\(sweptTokens.load(ordering: .relaxed))"
        }

        public func prometheusText(ready: Bool) -> String {
            func load(_ counter: borrowing Atomic<Int>) -> Int { counter.load(ordering: .relaxed) }
            var metrics = PrometheusText()
            metrics.family(
                "apns_cleanup_dead_tokens_total", "counter", "Dead-token events handled, by result.",
                [
                    ([("result", "removed")], load(deadTokensRemoved)), ([("result", "kept")], load(deadTokensKept))
                ])
            metrics.family(
                "apns_cleanup_registrations_total", "counter", "Registration events handled, by result.",
                [
                    ([("result", "applied")], load(registrationsApplied)),
                    ([("result", "stale")], load(registrationsStale)),
                    ([("result", "unregistered")], load(unregistrations))
                ])
            metrics.counter(
                "apns_cleanup_refused_total", "Messages parked on the failed queue as unreadable.", load(refused))
            metrics.counter("apns_cleanup_swept_tokens_total", "Tokens removed for inactivity.", load(sweptTokens))
            metrics.counter("apns_cleanup_sweeps_total", "Inactivity sweeps run.", load(sweeps))
            metrics.gauge("apns_cleanup_ready", "1 while consuming.", ready ? 1 : 0)
            return metrics.text
        }
    }

    public let configuration: WorkerConfiguration
    public let statistics = Statistics()
    private let logger: Logger
    private let wakeup = Wakeup()
    private let stopRequested = Atomic<Bool>(false)
    private let readiness = RoundTripReadiness()

    public init(configuration: WorkerConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
    }

    /// Consuming, and the broker and Redis answered a round trip within the last few seconds.
    public var isReady: Bool { readiness.isReady }

    public var metricsText: String { statistics.prometheusText(ready: isReady) }

    /// Consumes and sweeps until `stop()`.
    public func run() throws { try run(untilIdle: false) }

    public func stop() {
        stopRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// Consumes and sweeps until `stop()`, reconnecting with back-off. With `untilIdle`, returns instead once both
    /// queues have been empty for `idleSeconds` and one sweep has run (for cron jobs and tests); it then throws what
    /// went wrong rather than reconnecting.
    public func run(untilIdle: Bool = false, idleSeconds: Double = 1) throws {
        var nextSweep = Date()
        let loop = ReconnectLoop(logger: logger, wakeup: wakeup) { [unowned self] in
            stopRequested.load(ordering: .acquiring)
        }
        try loop.run(
            session: { connected in
                let amqp = try configuration.broker.nodes.connect(
                    heartbeat: configuration.broker.heartbeat,
                    caFile: configuration.broker.caFile)
                defer { amqp.close() }
                let redis = try configuration.redis.connect()
                let names = configuration.broker.queues
                try Topology.declareDeadTokens(on: amqp, names)
                try Topology.declare(names.registrations, on: amqp, names)
                try Topology.declare(names.failed, on: amqp, names)
                try amqp.setPrefetch(500)
                try amqp.enablePublisherConfirms()
                let deadTag = try amqp.consume(names.deadTokens)
                try amqp.consume(names.registrations)
                // Ready before the line that says so: whoever waits for the line may ask /readyz at once.
                readiness.consuming(true)
                logger.info(
                    "cleanup consuming",
                    [
                        "amqp.url": amqp.url.description,
                        "amqp.queue.dead_tokens": names.deadTokens,
                        "amqp.queue.registrations": names.registrations,
                        "cleanup.inactive_days": String(configuration.cleanup.inactiveDays)
                    ])
                connected()
                let finished = try serve(
                    amqp, redis, TokenCache(redis: redis, logger: logger), deadTag: deadTag,
                    untilIdle: untilIdle, idleSeconds: idleSeconds, nextSweep: &nextSweep)
                readiness.consuming(false)
                return finished
            },
            giveUp: { error, connectedOnce in
                if untilIdle { return error }
                return connectedOnce ? nil : StartupError(permanent: error)
            },
            lost: {
                readiness.consuming(false)
            })
    }

    /// Returns true when done (stopped, or idle in `untilIdle` mode).
    private func serve(
        _ amqp: AMQPConnection, _ redis: any RedisClient, _ tokens: TokenCache, deadTag: String,
        untilIdle: Bool, idleSeconds: Double, nextSweep: inout Date
    ) throws -> Bool {
        var idleSince = Date()
        var swept = false
        while !stopRequested.load(ordering: .acquiring) {
            var batch: [AMQPDelivery] = []
            while batch.count < 500, let event = try amqp.nextEvent(timeout: 0) {
                if case .delivery(let delivery) = event { batch.append(delivery) }
            }
            if !batch.isEmpty {
                try apply(batch, amqp: amqp, tokens: tokens, deadTag: deadTag)
                // A batch applied is a round trip to Redis and to the broker that answered.
                readiness.answered()
                idleSince = Date()
                continue
            }
            // Between batches, so that what was queued before the sweep (a late registration) counts.
            if Date() >= nextSweep {
                try sweep(tokens)
                swept = true
                nextSweep = Date().addingTimeInterval(configuration.cleanup.sweepInterval)
            }
            if untilIdle && swept && Date().timeIntervalSince(idleSince) >= idleSeconds { return true }
            if readiness.probeDue {
                // A round trip to each: one that does not answer within its timeout ends this session (reconnect).
                try redis.ping()
                _ = try amqp.queueStatus(configuration.broker.queues.deadTokens)
                readiness.answered()
            }
            if !amqp.hasBufferedInput {
                let untilSweep = max(0.001, nextSweep.timeIntervalSinceNow)
                wakeup.wait(
                    alsoReadable: amqp.socketDescriptor,
                    timeout: min(untilIdle ? idleSeconds : RoundTripReadiness.probeInterval, untilSweep))
            }
        }
        return true
    }

    private func sweep(_ tokens: TokenCache) throws {
        let cutoff = Int64(Date().timeIntervalSince1970 * 1000) - Int64(configuration.cleanup.inactiveDays) * 86_400_000
        let removed = try tokens.sweep(registeredBefore: cutoff)
        statistics.sweeps.add(1, ordering: .relaxed)
        statistics.sweptTokens.add(removed, ordering: .relaxed)
        logger.info(
            "inactivity sweep",
            [
                "cleanup.removed": String(removed),
                "cleanup.inactive_days": String(configuration.cleanup.inactiveDays)
            ])
    }

    /// A batch of events read: the changes they ask for, each with the delivery it came from, and the deliveries
    /// that cannot be read, with why.
    private struct ReadBatch {
        var removals: [TokenRemoval] = [], removalSources: [AMQPDelivery] = []
        var registrations = RegistrationChanges(), registrationSources: [AMQPDelivery] = []
        var bad: [(AMQPDelivery, String)] = []
    }

    private func read(_ batch: [AMQPDelivery], deadTag: String) -> ReadBatch {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        var read = ReadBatch()
        // Which delivery each Redis change came from, so that one Redis refuses (a key of the wrong type) is parked
        // with its reason like an unreadable message, and the rest of the batch proceeds.
        for delivery in batch {
            do throws(JobError) {
                if delivery.consumerTag == deadTag {
                    let event = try DeadTokenEvent.decode(delivery.body)
                    // Without a timestamp (BadDeviceToken) the token is wrong whatever happened since. An event is
                    // about one topic and environment: a token registered for another kind or app stays.
                    read.removals.append(
                        TokenRemoval(
                            user: event.user ?? "", token: event.token,
                            unlessRegisteredAfter: event.timestamp,
                            onlyIfValueIn: event.cacheValuesItRemoves(
                                defaultTopic: configuration.credential.defaultTopic)))
                    read.removalSources.append(delivery)
                    continue
                }
                let event = try RegistrationEvent.decode(delivery.body, now: now)
                if let problem = event.timeZoneProblem {
                    logger.warning(
                        "a registration's time zone is not kept; its token is registered without it",
                        [
                            "user": event.registration.user,
                            "time_zone": JobError.echo(event.ignoredTimeZone ?? ""),
                            "reason": problem
                        ])
                }
                read.registrations.append(event)
                read.registrationSources.append(delivery)
            } catch {
                read.bad.append((delivery, error.description))
            }
        }
        return read
    }

    /// A Redis round trip for the batch's dead tokens, one per run of logins or logouts (`RegistrationChanges`), then
    /// the acknowledgements.
    private func apply(_ batch: [AMQPDelivery], amqp: AMQPConnection, tokens: TokenCache, deadTag: String) throws {
        var read = read(batch, deadTag: deadTag)
        let removed = try tokens.remove(read.removals)
        let registered = try read.registrations.apply(to: tokens)
        // A Redis node that does not answer (a cluster master lost) holds some of these users: the batch goes back
        // unacknowledged, as with a lost connection, and is applied once the node answers.
        if removed.contains(.unavailable) || registered.contains(.unavailable) {
            throw RedisError(kind: .connectionLost, "a Redis node holding some of these users' tokens does not answer")
        }
        statistics.deadTokensRemoved.add(removed.filter { $0 == .applied }.count, ordering: .relaxed)
        statistics.deadTokensKept.add(removed.filter { $0 == .unchanged }.count, ordering: .relaxed)
        for (change, kind) in zip(registered, read.registrations.changes) {
            switch (change, kind.isRegistration) {
            case (.applied, true): statistics.registrationsApplied.add(1, ordering: .relaxed)
            case (.unchanged, true): statistics.registrationsStale.add(1, ordering: .relaxed)
            case (.applied, false): statistics.unregistrations.add(1, ordering: .relaxed)
            default: break
            }
        }
        for (changes, sources) in [(removed, read.removalSources), (registered, read.registrationSources)] {
            for (change, delivery) in zip(changes, sources) {
                if case .failed(let message) = change {
                    read.bad.append((delivery, "Redis refused the change: \(message)"))
                }
            }
        }
        try park(read.bad, amqp: amqp)
        if let last = batch.map(\.deliveryTag).max() { try amqp.ack(last, multiple: true) }
    }

    /// Unreadable events, and those Redis refused, go to the failed queue with their reason.
    private func park(_ bad: [(AMQPDelivery, String)], amqp: AMQPConnection) throws {
        guard !bad.isEmpty else { return }
        var last: UInt64 = 0
        for (delivery, reason) in bad {
            var properties = delivery.properties
            properties.persistent = true
            properties.headers[Worker.reasonHeader] = reason
            last = try amqp.publishKeepingWorkerHeaders(
                to: configuration.broker.queues.failed, body: delivery.body, properties: properties, logger: logger)
            logger.warning("unreadable message parked", ["amqp.queue": delivery.routingKey, "cleanup.reason": reason])
        }
        guard try amqp.waitForConfirms(through: last).isEmpty else {
            throw AMQPError.unconfirmed("parking unreadable messages on \(configuration.broker.queues.failed)")
        }
        statistics.refused.add(bad.count, ordering: .relaxed)
    }
}
