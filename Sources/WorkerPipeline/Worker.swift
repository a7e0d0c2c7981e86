import APNsModel
import Foundation
import Synchronization
import Telemetry
import Threads

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

    public init(
        core: WorkerCore.Settings, defaultTopic: String? = nil,
        invalidationGuard: MassInvalidationGuard = MassInvalidationGuard(threshold: 20),
        maximumSendAttempts: Int = 3, retryDelays: [Double] = [1, 15, 60, 300], maximumDeliveries: Int = 5,
        exitOnJobID: String? = nil
    ) {
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
/// clients), and its `SessionLoop` performs what `WorkerCore` and the rules decide. The sender's thread of a job's
/// lane owns its progress while its notifications are out (`AnswerCollector`). Work crosses between them in batches: a
/// batch of notifications goes out in one `send`; finished jobs come back with one wake-up.
public final class Worker: Service {
    public static let reasonHeader = "x-apns-worker-reason"
    /// On a job parked after its last attempt: how many attempts were made, and the device tokens still undelivered
    /// (comma-separated, the first `SettlementPlan.undeliveredListed` of them).
    public static let attemptsHeader = "x-apns-worker-attempts"
    public static let undeliveredHeader = "x-apns-worker-undelivered"
    /// On a job its publisher published again after losing its broker node before the confirm (the first copy may
    /// be in the queue too): the worker sends nothing the job's id already has a final outcome for.
    public static let republishedHeader = "x-apns-worker-republished"
    /// On a part of a job with a `local_window` (its users that waited for one opening of their hours): the job's own
    /// settlement published it, so it is not a copy of a settled job, and it is checked against the window again.
    public static let windowPartHeader = "x-apns-worker-window-part"
    /// On a copy whose job's headers no longer fit one frame with the worker's, how many of the job's were left out.
    public static let headersLeftOutHeader = "x-apns-worker-headers-left-out"
    /// Every header the worker writes (a publisher may write others under the same prefix).
    public static let ownHeaders: Set<String> = [
        reasonHeader, attemptsHeader, undeliveredHeader, republishedHeader, windowPartHeader, headersLeftOutHeader,
        StoreWaits.header, SessionLoop.broadcastAttemptHeader
    ]
    /// How this process appears in the fleet's statistics and in `apns-worker stats`.
    public static let identity = "\(ProcessInfo.processInfo.hostName):\(getpid())"

    public let settings: WorkerSettings
    public let statistics = WorkerStatistics()
    let logger: Logger
    package let sender: any NotificationSender
    let answers: AnswerCollector
    let wakeup = Wakeup()
    /// Broadcasts answered, from the lanes' threads, with the broker connection (generation) they were started on:
    /// the session of that generation settles them; a later one records the delivered ones, so that the redelivered
    /// job does not broadcast again.
    let broadcastAnswers = Locked<[BroadcastAnswer]>([])
    private let connect: @Sendable () throws -> WorkerSession
    private let stopRequested = Atomic<Bool>(false)
    private let readiness = RoundTripReadiness()
    /// The counters already added to the fleet's statistics (across sessions; the broker thread's alone).
    private let reportedThrough: Locked<WorkerStatistics.Snapshot>
    /// Answers this worker holds and the idempotency record does not (its node did not answer, or the connection
    /// was lost while they were written), across sessions: written before anything else is, and before any
    /// redelivered job is looked up; dropped once their job is acknowledged. The broker thread's alone.
    let unwrittenOutcomes = Locked<[(jobID: String, outcomes: [SettledOutcome])]>([])
    /// History keys of deliveries a lost session handed back, not yet noted in the store (it was what was lost):
    /// noted first thing in the next session. The broker thread's alone.
    let givenBackUnwritten = Locked<[String]>([])
    /// Alone-marks of suspects a session left under way that the store did not take off (it was gone): taken off
    /// by the next session, before any delivery is judged, so that a healthy suspect is not later read as one its
    /// worker died with.
    let aloneMarksUnwritten = Locked<[String]>([])

    /// `sender` carries the notifications; `connect` opens one session (broker and store): it is called on the
    /// broker thread, again after each loss.
    public init(
        settings: WorkerSettings, sender: any NotificationSender, logger: Logger,
        connect: @escaping @Sendable () throws -> WorkerSession
    ) {
        self.settings = settings
        self.logger = logger
        self.sender = sender
        self.connect = connect
        answers = AnswerCollector(statistics: statistics, logger: logger, sender: sender, wakeup: wakeup)
        reportedThrough = Locked(statistics.snapshot())
    }

    /// Whether the worker can work now: consuming, the broker and the store answering (`RoundTripReadiness`), and
    /// an APNs connection open.
    public var isReady: Bool { readiness.isReady && statistics.openConnections > 0 }

    public var metricsText: String { statistics.prometheusText(ready: isReady) }

    /// Asks `run()` to stop consuming, finish what is under way (up to the shutdown timeout) and return.
    public func stop() {
        stopRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    var isStopRequested: Bool { stopRequested.load(ordering: .acquiring) }

    func markAlive() { readiness.answered() }

    /// Runs until `stop()`; reconnects with back-off when the broker or the store goes away. Only connection
    /// failures reach here: a data error (a key of the wrong type, a bad job) is settled where it concerns one user,
    /// token or job, and the rest of the batch proceeds. Before the first session, a refusal that waiting cannot
    /// cure (`ConnectionRefused`: credentials, a vhost, a database) is thrown; a broker or store that is merely down
    /// is waited for.
    public func run() throws {
        let statistics = self.statistics
        sender.start { health in statistics.count(health) }
        var generation = 0
        var openedRecentPools = false
        let loop = ReconnectLoop(logger: logger, wakeup: wakeup) { [unowned self] in isStopRequested }
        do {
            try loop.run(
                session: { connected in
                    generation += 1
                    // Queue depths are this session's view: none is reported once it ends, however it ends.
                    defer { statistics.laneQueues = nil }
                    if generation > 1 { awaitAnswersInFlight(for: Self.answersInFlightWait) }
                    do {
                        let session = try connect()
                        statistics.answered(.broker)
                        statistics.answered(.store)
                        if !openedRecentPools {
                            openedRecentPools = true
                            openPoolsSentRecently(session.statistics)
                        }
                        connected()
                        readiness.consuming(true)
                        logger.info("consuming", session.logMetadata)
                        try SessionLoop(worker: self, session: session, generation: generation).serve()
                    } catch let failure as SystemFailure {
                        statistics.unreachable(failure.failedSystem)
                        throw failure
                    }
                    readiness.consuming(false)
                    return true
                },
                giveUp: { error, connectedOnce in
                    !connectedOnce && error is ConnectionRefused ? error : nil
                },
                lost: {
                    readiness.consuming(false)
                })
        } catch {
            sender.shutdown()
            throw error
        }
        sender.shutdown()
        logger.info("worker stopped", ["stats": statistics.snapshot().summary])
    }

    /// How far back the fleet's sending decides which connections a starting worker opens before its first push.
    static let recentSendingWindow: Double = 3600

    /// The connections of every credential and environment the fleet sent with in the last hour open now, so that the
    /// first push of each does not wait for a handshake (production opened at start already). Once per process.
    private func openPoolsSentRecently(_ sink: any StatisticsSink) {
        do {
            guard case .answered(let pools) = try sink.sentRecently(within: Self.recentSendingWindow) else { return }
            logger.info(
                "opening the connections the fleet sent with lately",
                ["apns.pools": pools.map { "\($0.credential) \($0.environment.rawValue)" }.joined(separator: ", ")])
            sender.open(pools)
        } catch {
            logger.warning("cannot read which connections the fleet sent with lately", ["error": "\(error)"])
        }
    }

    /// Longest a new session waits for the answers to the notifications the last one left in flight.
    static let answersInFlightWait = 5.0

    /// Before a lost session records its answers, and before the next one consumes: the notifications left in flight
    /// are answered first (or the wait runs out), so that their answers are in the idempotency record before a
    /// redelivery of their job can be looked up. Answers wake the broker thread, so this waits on them, not on a
    /// clock.
    func awaitAnswersInFlight(for seconds: Double) {
        let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(seconds * 1e9)
        while statistics.notificationsInFlight > 0 && !isStopRequested {
            let now = DispatchTime.now().uptimeNanoseconds
            guard now < deadline else {
                logger.warning(
                    "reconnecting with notifications still unanswered: a redelivery of their jobs may send "
                        + "them again", ["apns.in_flight": String(statistics.notificationsInFlight)])
                return
            }
            wakeup.wait(timeout: min(0.1, Double(deadline - now) / 1e9))
        }
    }

    /// Adds what happened since the last report to the fleet's statistics; returns what the store refused, if
    /// anything. Counts the store could not take now (its node does not answer) go with the next report. Broker
    /// thread only.
    func reportStatistics(to sink: any StatisticsSink) throws -> String? {
        let now = statistics.snapshot()
        let longestWait = statistics.longestWait.take()
        switch try sink.report(
            now.subtracting(reportedThrough.withLock { $0 }), longestWait: longestWait,
            worker: Self.identity)
        {
        case .answered:
            reportedThrough.withLock { $0 = now }
            let sending = sender.takeSendingPools()
            if !sending.isEmpty { _ = try sink.recordSending(sending) }
            return nil
        case .refused(let message):
            reportedThrough.withLock { $0 = now }
            return message
        case .unavailable:
            statistics.countStoreUnavailable("statistics")
            return nil
        }
    }
}

extension WorkerStatistics {
    /// Counts what became of a sender's connection.
    func count(_ health: ConnectionHealth) {
        switch health {
        case .opened: connectionsOpened.add(1, ordering: .relaxed)
        case .closed: connectionsClosed.add(1, ordering: .relaxed)
        case .goAway: goAways.add(1, ordering: .relaxed)
        case .connectFailed: connectFailures.add(1, ordering: .relaxed)
        }
    }
}
