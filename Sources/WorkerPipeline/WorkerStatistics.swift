import APNsModel
import Synchronization
import Telemetry
import Threads

/// Process-wide counters, safe to bump from any thread.
public final class WorkerStatistics: Sendable {
    public let jobsCompleted = Atomic<Int>(0)
    public let jobsRejected = Atomic<Int>(0)
    /// Jobs taken and then parked: after their last attempt, or because no credential served their topic any more.
    public let jobsParked = Atomic<Int>(0)
    /// Of `jobsParked`: those parked because a reload took their topic's credential away.
    public let unservedJobsParked = Atomic<Int>(0)
    public let delivered = Atomic<Int>(0)
    public let deadTokens = Atomic<Int>(0)
    public let permanentFailures = Atomic<Int>(0)
    /// 400 BadDeviceToken / DeviceTokenNotForTopic answers the mass-invalidation guard held back (no removal, no
    /// event), and the jobs in which it did.
    public let heldBack = Atomic<Int>(0)
    public let invalidationGuardTrips = Atomic<Int>(0)
    /// The fleet's window, as this worker last weighed it: tripped or not, and how often it went from not to tripped.
    public let fleetGuardTripped = Atomic<Bool>(false)
    public let invalidationGuardFleetTrips = Atomic<Int>(0)
    /// Jobs delivered more often than allowed, parked unread (also counted as rejected).
    public let poisonJobs = Atomic<Int>(0)
    /// Jobs parked on the failed queue (the broker confirmed): refused as unreadable or invalid, and poison ones.
    /// Jobs parked after their last attempt are `jobsParked`.
    public let invalidJobsParked = Atomic<Int>(0)
    public let poisonJobsParked = Atomic<Int>(0)
    /// Jobs put back in a delay queue to wait for a Redis node that does not answer (`StoreWaits`).
    public let jobsWaiting = Atomic<Int>(0)
    /// Jobs put back to wait for their `send_at` in a delay queue (one per hop).
    public let jobsScheduled = Atomic<Int>(0)
    /// Bulk jobs delivered and not started while the bulk jobs under way hold their budget (`BulkAdmission`).
    public let bulkJobsAwaitingAdmission = Atomic<Int>(0)
    /// Jobs run alone as suspects: delivered twice or more before without being settled (`DeliveryTriage`).
    public let suspectJobs = Atomic<Int>(0)
    /// Jobs taken and not settled yet, both lanes, as of the last readiness round trip (every second).
    public let jobsInFlight = Atomic<Int>(0)
    public let retries = Atomic<Int>(0)
    /// Notifications whose job's deadline passed before they could be handed to APNs (not sent).
    public let expired = Atomic<Int>(0)
    /// Notifications not sent because their job was cancelled (`apns-worker jobs cancel`).
    public let cancelled = Atomic<Int>(0)
    /// Per lane: jobs taken (started), notifications handed to APNs, and notifications handed over and unanswered.
    public let jobsTaken = LaneCounters()
    public let sent = LaneCounters()
    public let inFlight = LaneCounters()
    /// Per lane, the longest a job taken since the last report had waited in its queue (milliseconds, from the
    /// message's timestamp; jobs without one are not measured). Reported to the fleet's statistics, then reset.
    public let longestWait = LaneCounters()
    /// Times a batch found the shared rate window spent and waited for the next one.
    public let rateLimitWaits = Atomic<Int>(0)
    /// Notifications of redelivered jobs not sent again because the idempotency record showed them done.
    public let duplicatesAvoided = Atomic<Int>(0)
    /// Copies a publisher made after a failover of jobs already settled: acknowledged without sending.
    public let republishedCopiesSkipped = Atomic<Int>(0)

    /// APNs connections opened and closed, GOAWAYs received, failed connects (from the client's events).
    public let connectionsOpened = Atomic<Int>(0)
    public let connectionsClosed = Atomic<Int>(0)
    public let goAways = Atomic<Int>(0)
    public let connectFailures = Atomic<Int>(0)

    /// The broker blocks publishing (a memory or disk alarm): the worker waits, nothing is lost.
    public let brokerBlocked = Atomic<Bool>(false)
    public let brokerBlocks = Atomic<Int>(0)

    /// Notifications handed to the APNs client and not answered yet, both lanes.
    public var notificationsInFlight: Int { inFlight.counts.total }
    /// Per lane, from handing a batch to the APNs client to each answer (includes waiting for a stream, and
    /// resends); /metrics also gives their sum.
    public let urgentLatency = Histogram()
    public let bulkLatency = Histogram()

    public func latency(_ lane: JobLane) -> Histogram { lane == .urgent ? urgentLatency : bulkLatency }
    /// Data errors, by where they happened: a key of the wrong type, a record Redis refused. Each concerns one user,
    /// token or job, which is skipped or settled with its reason while the rest proceeds.
    private let dataErrors = Locked<[String: Int]>([:])
    /// Answers other than 200, by status and reason ("none" for notifications that got no answer). Counted off the
    /// hot path: only failures take the lock.
    private let unsuccessful = Locked<[ResponseKey: Int]>([:])

    struct ResponseKey: Hashable {
        var status: String
        var reason: String
    }

    /// Notifications scheduled for another attempt, by reason (Apple's reason, `no_answer`, or `other`).
    private let retriesByReason = Locked<[String: Int]>([:])
    /// The reasons /metrics shows from the start (at zero), so that alerts and dashboards find the series.
    static let usualRetryReasons = [
        "TooManyRequests", "InternalServerError", "ServiceUnavailable", "Shutdown",
        "ExpiredProviderToken", "no_answer"
    ]
    /// Both lanes' queues as the last readiness round trip found them (nil before the first).
    private let lastLaneQueues = Locked<LaneQueues?>(nil)
    /// Whether the last attempt to reach the broker and the store (a connect, a round trip) succeeded; absent
    /// before the first.
    private let reachable = Locked<[ConnectionRefused.System: Bool]>([:])

    public init() {}

    public func countRetries(_ reasons: some Sequence<String>) {
        var count = 0
        retriesByReason.withLock { table in
            for reason in reasons {
                table[reason, default: 0] += 1
                count += 1
            }
        }
        retries.add(count, ordering: .relaxed)
    }

    public var laneQueues: LaneQueues? {
        get { lastLaneQueues.withLock { $0 } }
        set { lastLaneQueues.withLock { $0 = newValue } }
    }

    public func answered(_ system: ConnectionRefused.System) { reachable.withLock { $0[system] = true } }

    public func unreachable(_ system: ConnectionRefused.System) { reachable.withLock { $0[system] = false } }

    public var openConnections: Int {
        connectionsOpened.load(ordering: .relaxed) - connectionsClosed.load(ordering: .relaxed)
    }

    /// Publishes the broker handed back or refused, by kind (job_outputs, rejected_job, summary).
    private let refusedPublishes = Locked<[String: Int]>([:])

    public func countRefusedPublish(_ kind: String) { refusedPublishes.withLock { $0[kind, default: 0] += 1 } }

    public func refusedPublishCount(_ kind: String) -> Int { refusedPublishes.withLock { $0[kind] ?? 0 } }

    /// Acknowledgement frames sent to the broker, over every session.
    private let acknowledgementFrames = Locked(AcknowledgementFrames())

    public func countAcknowledgementFrames(_ frames: AcknowledgementFrames) {
        acknowledgementFrames.withLock { counted in
            counted.multiple += frames.multiple
            counted.single += frames.single
        }
    }

    public var acknowledgementFramesSent: AcknowledgementFrames { acknowledgementFrames.withLock { $0 } }

    /// `place`: token_cache_read, token_removal, idempotency_record, statistics, rate_limit.
    public func countDataError(_ place: String, _ count: Int = 1) {
        guard count > 0 else { return }
        dataErrors.withLock { $0[place, default: 0] += count }
    }

    public func dataErrorCount(_ place: String) -> Int { dataErrors.withLock { $0[place] ?? 0 } }

    /// Requests to Redis, by what they were for, that met a node that does not answer (a cluster master lost): the
    /// users, activities or records on it wait; what concerns other nodes goes on.
    private let storeUnavailable = Locked<[String: Int]>([:])

    /// `operation`: resolve, record, lookup, token_removal, statistics, guard_window.
    public func countStoreUnavailable(_ operation: String, _ count: Int = 1) {
        guard count > 0 else { return }
        storeUnavailable.withLock { $0[operation, default: 0] += count }
    }

    public func storeUnavailableCount(_ operation: String) -> Int { storeUnavailable.withLock { $0[operation] ?? 0 } }

    /// Broadcast requests by what became of them (delivered, failed, retrying).
    private let broadcasts = Locked<[String: Int]>([:])

    public func countBroadcast(_ outcome: String) { broadcasts.withLock { $0[outcome, default: 0] += 1 } }

    public func broadcastCount(_ outcome: String) -> Int { broadcasts.withLock { $0[outcome] ?? 0 } }

    public func countUnsuccessful(status: Int?, reason: String) {
        let key = ResponseKey(status: status.map(String.init) ?? "none", reason: reason)
        unsuccessful.withLock { $0[key, default: 0] += 1 }
    }

    /// The Prometheus text exposition of every counter.
    public func prometheusText(ready: Bool) -> String {
        var metrics = PrometheusText()
        outcomeFamilies(&metrics)
        guardFamilies(&metrics)
        answerAndErrorFamilies(&metrics)
        retryParkAndDependencyFamilies(&metrics)
        connectionFamilies(&metrics)
        metrics.gauge(
            "apns_worker_ready", "1 while consuming (broker and Redis connected) with an APNs connection open.",
            ready ? 1 : 0)
        return metrics.text
    }

    private func load(_ counter: borrowing Atomic<Int>) -> Int { counter.load(ordering: .relaxed) }

    /// Jobs, notifications and broadcasts by outcome, and the lanes' counts.
    private func outcomeFamilies(_ metrics: inout PrometheusText) {
        metrics.family(
            "apns_worker_jobs_total", "counter", "Jobs acknowledged, by what became of them.",
            [
                ([("result", "completed")], load(jobsCompleted)), ([("result", "rejected")], load(jobsRejected)),
                ([("result", "waiting")], load(jobsWaiting)), ([("result", "scheduled")], load(jobsScheduled)),
                ([("result", "parked")], load(jobsParked))
            ])
        metrics.family(
            "apns_worker_notifications_total", "counter", "Notifications with a final outcome, by outcome.",
            [
                ([("outcome", "delivered")], load(delivered)), ([("outcome", "dead_token")], load(deadTokens)),
                ([("outcome", "failed")], load(permanentFailures)), ([("outcome", "held_back")], load(heldBack)),
                ([("outcome", "expired")], load(expired)), ([("outcome", "cancelled")], load(cancelled))
            ])
        let broadcastCounts = broadcasts.withLock { $0 }
        metrics.family(
            "apns_worker_broadcasts_total", "counter",
            "Broadcast requests (channel_id jobs, one request each for every subscribed device), by outcome.",
            ["delivered", "failed", "retrying", "expired"].map { ([("outcome", $0)], broadcastCounts[$0] ?? 0) })
        metrics.family(
            "apns_worker_lane_jobs_total", "counter", "Jobs taken from each lane's queue.",
            JobLane.allCases.map { ([("lane", $0.rawValue)], jobsTaken[$0]) })
        metrics.family(
            "apns_worker_lane_sent_total", "counter", "Notifications of each lane handed to APNs.",
            JobLane.allCases.map { ([("lane", $0.rawValue)], sent[$0]) })
        metrics.family(
            "apns_worker_lane_in_flight", "gauge", "Notifications of each lane sent to APNs and not answered yet.",
            JobLane.allCases.map { ([("lane", $0.rawValue)], inFlight[$0]) })
    }

    /// The mass-invalidation guard, suspects and poison jobs.
    private func guardFamilies(_ metrics: inout PrometheusText) {
        metrics.counter(
            "apns_worker_invalidation_guard_trips_total",
            "Jobs whose 400 BadDeviceToken/DeviceTokenNotForTopic answers were held back as a likely "
                + "configuration error (no token removed, no dead-token event).", load(invalidationGuardTrips))
        metrics.gauge(
            "apns_worker_invalidation_guard_fleet_tripped",
            "1 while the fleet's recent 400 BadDeviceToken/DeviceTokenNotForTopic answers are held back as a "
                + "likely configuration error (as this worker last weighed them), else 0.",
            fleetGuardTripped.load(ordering: .relaxed) ? 1 : 0)
        metrics.counter(
            "apns_worker_invalidation_guard_fleet_trips_total",
            "Times this worker found the fleet's window tripped after it was not.",
            load(invalidationGuardFleetTrips))
        metrics.counter(
            "apns_worker_suspect_jobs_total",
            "Jobs run alone as suspects: delivered twice or more before without being settled, by workers "
                + "that died (deliveries given back by orderly stops and lost connections do not count).",
            load(suspectJobs))
        metrics.counter(
            "apns_worker_poison_jobs_total",
            "Jobs delivered more often than the delivery limit allows, parked on the failed queue unread.",
            load(poisonJobs))
    }

    /// APNs answers, data errors, Redis nodes that did not answer, publishes refused.
    private func answerAndErrorFamilies(_ metrics: inout PrometheusText) {
        let answers = unsuccessful.withLock { $0 }.sorted {
            ($0.key.status, $0.key.reason) < ($1.key.status, $1.key.reason)
        }
        metrics.family(
            "apns_worker_apns_responses_total", "counter",
            "APNs answers by HTTP status and reason (status \"none\": no answer, reason says why).",
            [([("status", "200"), ("reason", "")], load(delivered))]
                + answers.map { key, count in
                    ([("status", key.status), ("reason", key.reason)], count)
                })
        metrics.family(
            "apns_worker_data_errors_total", "counter",
            "Data errors (a Redis key of the wrong type, a record refused), each about one user, token or job, "
                + "by where they happened.",
            dataErrors.withLock { $0 }.sorted { $0.key < $1.key }.map { ([("where", $0.key)], $0.value) })
        metrics.family(
            "apns_worker_redis_unavailable_total", "counter",
            "Jobs, users, records and removals that met a Redis node that did not answer (a cluster master "
                + "lost), by operation: they wait or are skipped while every other node's work goes on.",
            storeUnavailable.withLock { $0 }.sorted { $0.key < $1.key }.map { ([("operation", $0.key)], $0.value) })
        metrics.family(
            "apns_worker_publishes_refused_total", "counter",
            "Publishes the broker handed back (no queue took them) or refused, by kind; a job's outputs and "
                + "rejected jobs are held and published again, summaries are only logged.",
            refusedPublishes.withLock { $0 }.sorted { $0.key < $1.key }.map { ([("kind", $0.key)], $0.value) })
        let frames = acknowledgementFramesSent
        metrics.family(
            "apns_worker_acknowledgement_frames_total", "counter",
            "Acknowledgement frames sent to the broker, by kind: a multiple one settles every job up to its own, a "
                + "single one a job that could not wait for an older one.",
            [([("kind", "multiple")], frames.multiple), ([("kind", "single")], frames.single)])
    }

    /// Notifications in flight and their latency, rate-limit waits, duplicates avoided, connections, the broker's blocks.
    private func connectionFamilies(_ metrics: inout PrometheusText) {
        metrics.gauge(
            "apns_worker_apns_in_flight", "Notifications sent to APNs and not answered yet.", notificationsInFlight)
        metrics.gauge(
            "apns_worker_bulk_jobs_awaiting_admission",
            "Bulk jobs delivered and not started while the large bulk jobs under way hold their budget.",
            load(bulkJobsAwaitingAdmission))
        metrics.histogram(
            "apns_worker_apns_latency_seconds", "From handing a notification to the APNs client to its answer.",
            summing: JobLane.allCases.map(latency))
        metrics.histograms(
            "apns_worker_lane_latency_seconds",
            "From handing a notification of the lane to the APNs client to its answer.",
            JobLane.allCases.map { ([("lane", $0.rawValue)], latency($0)) })
        metrics.counter(
            "apns_worker_rate_limit_waits_total", "Batches that waited for the shared rate limit.",
            load(rateLimitWaits))
        metrics.counter(
            "apns_worker_duplicates_avoided_total",
            "Notifications of redelivered jobs not sent again (idempotency record).", load(duplicatesAvoided))
        metrics.counter(
            "apns_worker_republished_copies_skipped_total",
            "Copies of settled jobs (made by their publisher after a broker failover) and redeliveries of "
                + "settled jobs (an acknowledgement lost with its connection), acknowledged without sending.",
            load(republishedCopiesSkipped))
        metrics.gauge("apns_worker_apns_connections", "Open HTTP/2 connections to APNs.", openConnections)
        metrics.counter(
            "apns_worker_apns_connections_opened_total",
            "HTTP/2 connections to APNs opened, the first ones included (reconnects and growth add to it).",
            load(connectionsOpened))
        metrics.counter("apns_worker_apns_goaways_total", "GOAWAY frames received from APNs.", load(goAways))
        metrics.counter(
            "apns_worker_apns_connect_failures_total", "Failed or unproductive APNs connections.",
            load(connectFailures))
        metrics.gauge(
            "apns_worker_broker_blocked", "1 while the broker blocks publishing (resource alarm).",
            brokerBlocked.load(ordering: .relaxed) ? 1 : 0)
        metrics.counter("apns_worker_broker_blocks_total", "Times the broker blocked publishing.", load(brokerBlocks))
    }

    /// Retries and parked jobs by reason, the lanes' queues and the dependencies' reachability: what the alert rules
    /// and the dashboard (deploy/) read besides the counters above.
    private func retryParkAndDependencyFamilies(_ metrics: inout PrometheusText) {
        let retried = retriesByReason.withLock { $0 }
        metrics.family(
            "apns_worker_retries_total", "counter",
            "Notifications scheduled for another attempt (through a delay queue), by reason.",
            Set(Self.usualRetryReasons).union(retried.keys).sorted().map { ([("reason", $0)], retried[$0] ?? 0) })
        metrics.family(
            "apns_worker_parked_jobs_total", "counter",
            "Jobs parked on the failed queue, by reason: invalid_job (refused as unreadable or breaking the "
                + "format), poison (delivered more often than allowed), attempts_exhausted (notifications "
                + "still undelivered after the last attempt), no_credential (taken, then no credential "
                + "served their topic any more: a reload removed it).",
            [
                ([("reason", "attempts_exhausted")], load(jobsParked) - load(unservedJobsParked)),
                ([("reason", "no_credential")], load(unservedJobsParked)),
                ([("reason", "invalid_job")], load(invalidJobsParked)),
                ([("reason", "poison")], load(poisonJobsParked))
            ])
        metrics.gauge(
            "apns_worker_jobs_in_flight", "Jobs taken and not settled yet, both lanes (updated every second).",
            load(jobsInFlight))
        if let queues = laneQueues {
            metrics.family(
                "apns_worker_queue_messages", "gauge",
                "Messages waiting in each lane's queue, as this worker's last readiness round trip found them "
                    + "(every worker reports the same queues: take the max).",
                JobLane.allCases.map { ([("lane", $0.rawValue)], queues.messages[$0]) })
            metrics.family(
                "apns_worker_queue_consumers", "gauge",
                "Consumers of each lane's queue (the whole fleet's), as this worker's last round trip found them.",
                JobLane.allCases.map { ([("lane", $0.rawValue)], queues.consumers[$0]) })
        }
        let systems = reachable.withLock { $0 }
        metrics.family(
            "apns_worker_dependency_up", "gauge",
            "1 when the last attempt to reach the dependency (a connect, a readiness round trip) succeeded, "
                + "0 when it failed.",
            [(ConnectionRefused.System.broker, "broker"), (.store, "redis")].compactMap { system, name in
                systems[system].map { ([("dependency", name)], $0 ? 1 : 0) }
            })
    }

    public struct Snapshot: Sendable, Equatable {
        public var jobsCompleted = 0, jobsRejected = 0, jobsParked = 0, delivered = 0, deadTokens = 0,
            permanentFailures = 0, heldBack = 0, retries = 0, expired = 0
        public var jobsTaken = LaneCounts(), sent = LaneCounts()

        public init() {}

        /// Names as `SharedStatistics` stores them, with values.
        public var fields: [(name: String, value: Int)] {
            [
                ("delivered", delivered), ("dead_tokens", deadTokens), ("failed", permanentFailures),
                ("held_back", heldBack),
                ("expired", expired), ("retries", retries), ("jobs", jobsCompleted), ("rejected", jobsRejected),
                ("parked", jobsParked), ("urgent_jobs", jobsTaken.urgent), ("bulk_jobs", jobsTaken.bulk),
                ("urgent_sent", sent.urgent), ("bulk_sent", sent.bulk)
            ]
        }

        /// The names `fields` uses, in the same order (what `SharedStatistics` stores and `stats` shows).
        public static let fieldNames = Snapshot().fields.map(\.name)

        /// What happened between `earlier` and this one.
        public func subtracting(_ earlier: Snapshot) -> Snapshot {
            var delta = Snapshot()
            delta.jobsCompleted = jobsCompleted - earlier.jobsCompleted
            delta.jobsRejected = jobsRejected - earlier.jobsRejected
            delta.jobsParked = jobsParked - earlier.jobsParked
            delta.delivered = delivered - earlier.delivered
            delta.deadTokens = deadTokens - earlier.deadTokens
            delta.permanentFailures = permanentFailures - earlier.permanentFailures
            delta.heldBack = heldBack - earlier.heldBack
            delta.retries = retries - earlier.retries
            delta.expired = expired - earlier.expired
            delta.jobsTaken = LaneCounts(
                urgent: jobsTaken.urgent - earlier.jobsTaken.urgent,
                bulk: jobsTaken.bulk - earlier.jobsTaken.bulk)
            delta.sent = LaneCounts(urgent: sent.urgent - earlier.sent.urgent, bulk: sent.bulk - earlier.sent.bulk)
            return delta
        }

        public var summary: String {
            "jobs=\(jobsCompleted) rejected=\(jobsRejected) parked=\(jobsParked) delivered=\(delivered) "
                + "dead_tokens=\(deadTokens) failed=\(permanentFailures) held_back=\(heldBack) expired=\(expired) "
                + "retries=\(retries) urgent_sent=\(sent.urgent) bulk_sent=\(sent.bulk)"
        }
    }

    public func snapshot() -> Snapshot {
        var snapshot = Snapshot()
        snapshot.jobsCompleted = jobsCompleted.load(ordering: .relaxed)
        snapshot.jobsRejected = jobsRejected.load(ordering: .relaxed)
        snapshot.jobsParked = jobsParked.load(ordering: .relaxed)
        snapshot.delivered = delivered.load(ordering: .relaxed)
        snapshot.deadTokens = deadTokens.load(ordering: .relaxed)
        snapshot.permanentFailures = permanentFailures.load(ordering: .relaxed)
        snapshot.heldBack = heldBack.load(ordering: .relaxed)
        snapshot.retries = retries.load(ordering: .relaxed)
        snapshot.expired = expired.load(ordering: .relaxed)
        snapshot.jobsTaken = jobsTaken.counts
        snapshot.sent = sent.counts
        return snapshot
    }
}

/// A counter per lane, safe to bump from any thread.
public final class LaneCounters: Sendable {
    private let urgent = Atomic<Int>(0)
    private let bulk = Atomic<Int>(0)

    public init() {}

    public subscript(lane: JobLane) -> Int {
        lane == .urgent ? urgent.load(ordering: .relaxed) : bulk.load(ordering: .relaxed)
    }

    public var counts: LaneCounts { LaneCounts(urgent: self[.urgent], bulk: self[.bulk]) }

    @discardableResult
    public func add(_ lane: JobLane, _ count: Int) -> Int {
        lane == .urgent ? urgent.add(count, ordering: .relaxed).newValue : bulk.add(count, ordering: .relaxed).newValue
    }

    public func store(_ lane: JobLane, _ value: Int) {
        if lane == .urgent { urgent.store(value, ordering: .relaxed) } else { bulk.store(value, ordering: .relaxed) }
    }

    /// Keeps the larger of the current value and `value`.
    public func raise(_ lane: JobLane, to value: Int) {
        if lane == .urgent { urgent.max(value, ordering: .relaxed) } else { bulk.max(value, ordering: .relaxed) }
    }

    /// The values, set back to zero.
    public func take() -> LaneCounts {
        LaneCounts(urgent: urgent.exchange(0, ordering: .relaxed), bulk: bulk.exchange(0, ordering: .relaxed))
    }
}
