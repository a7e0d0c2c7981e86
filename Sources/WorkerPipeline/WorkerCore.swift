import APNsModel
import Foundation

/// What the worker's broker thread decides, as a value: the loop that performs the actions (`Worker.serve`) tells it
/// what it sees and what it did, and does what it is told in the order given. Every decision is tested here without
/// a broker, a store or APNs.
///
/// Two in-flight counts, for what they count: jobs delivered and not yet settled (this core's, bounded by the
/// prefetch), and notifications handed to APNs and not yet answered (the client's, bounded by
/// `maximumNotificationsInFlight` in each lane).
///
/// Lanes: urgent work always goes first. Each turn reads what arrived and sends the urgent notifications it brings
/// before anything else is done (recording, settling, bulk work); the heavy part of bulk work (decoding bulk jobs,
/// resolving their users) happens on the session's preparer thread, not in a turn;
/// bulk jobs are started (their users resolved, their notifications queued) a few at a time and only while the bulk
/// lane has less than a window queued, so that urgent deliveries never wait long behind a large bulk job being
/// resolved; and a stop gives unstarted bulk jobs back to the broker at once.
public struct WorkerCore: Sendable {
    public struct Settings: Sendable, Equatable {
        /// Deliveries read per turn at most (the broker's prefetch per lane bounds what it hands over anyway).
        public var prefetch: Int
        /// Notifications handed to APNs and unanswered, per lane.
        public var maximumNotificationsInFlight: Int
        /// Bulk jobs handed to the preparer per turn at most.
        public var bulkJobsPerTurn: Int
        /// Notifications of one lane handed to APNs per turn at most: the broker thread builds a hand-over in one go,
        /// and the lane's sender thread writes its requests in one go.
        public var sendBatchLimit: Int
        /// How long a stop waits for the jobs under way before leaving them to the broker.
        public var shutdownTimeout: Double
        /// A round trip to the broker and the store this often (readiness).
        public var probeInterval: Double
        /// Counters added to the fleet's statistics this often.
        public var reportInterval: Double
        /// A progress line in the log this often while work flows.
        public var progressInterval: Double
        /// Users of one job resolved at a time: a larger job is resolved and sent in pieces (`JobAssembly`).
        public var usersPerPiece: Int
        /// Bulk jobs handed to the preparer in one turn, by the size of their bodies (at least one job): the preparer
        /// decodes and resolves them as one batch, and the batch must come back soon for the bulk lane to keep
        /// flowing, a few large jobs taking as long as many small ones.
        public var bulkBytesPerTurn: Int
        /// How much large bulk work is under way at once (`BulkAdmission`).
        public var bulkAdmission: BulkAdmission

        public init(
            prefetch: Int, maximumNotificationsInFlight: Int, shutdownTimeout: Double, bulkJobsPerTurn: Int = 16,
            sendBatchLimit: Int = 256, probeInterval: Double = 1, reportInterval: Double = 5,
            progressInterval: Double = 10, usersPerPiece: Int = 250, bulkBytesPerTurn: Int = 8 << 10,
            bulkAdmission: BulkAdmission = BulkAdmission()
        ) {
            self.usersPerPiece = usersPerPiece
            self.bulkAdmission = bulkAdmission
            self.bulkBytesPerTurn = bulkBytesPerTurn
            self.prefetch = prefetch
            self.maximumNotificationsInFlight = maximumNotificationsInFlight
            self.bulkJobsPerTurn = bulkJobsPerTurn
            self.sendBatchLimit = sendBatchLimit
            self.shutdownTimeout = shutdownTimeout
            self.probeInterval = probeInterval
            self.reportInterval = reportInterval
            self.progressInterval = progressInterval
        }
    }

    /// What the loop sees at the start of a turn.
    public struct Observation: Sendable {
        public var now: Date
        public var stopRequested: Bool
        /// Final outcomes handed over for the idempotency record.
        public var outcomesWaiting: Bool
        /// Jobs whose every notification has an outcome, delivered on this connection, and on an older one.
        public var completedJobs: Int
        public var staleCompletions: Int
        /// When the earliest publication the broker did not take is due again.
        public var heldDue: Date?

        public init(
            now: Date, stopRequested: Bool = false, outcomesWaiting: Bool = false, completedJobs: Int = 0,
            staleCompletions: Int = 0, heldDue: Date? = nil
        ) {
            self.now = now
            self.stopRequested = stopRequested
            self.outcomesWaiting = outcomesWaiting
            self.completedJobs = completedJobs
            self.staleCompletions = staleCompletions
            self.heldDue = heldDue
        }
    }

    public enum Exit: Equatable, Sendable {
        /// Stopping, and every job under way settled.
        case drained
        /// Stopping, and the shutdown timeout passed: the broker redelivers what is left.
        case deadlinePassed(unfinishedJobs: Int)
    }

    /// What the first half of a turn does, in this order. Reading comes first, so that an urgent job waits for no
    /// more than the turn under way when it arrives; the answers and completions it does not take yet stay with the
    /// collector. A reading that fails leaves them for the next session, which records their outcomes (before it
    /// looks up any redelivered job) but settles none of the completions: their deliveries went with the connection.
    public enum BeginAction: Equatable, Sendable {
        /// A stop was asked for: say so (with the jobs under way); reading stops, the jobs under way finish.
        case announceStop(jobsInFlight: Int)
        /// Give the jobs read and not started yet (bulk jobs, jobs waiting behind suspects) back to the broker.
        case requeueUnstarted
        /// Leave this session.
        case exit(Exit)
        case readDeliveries(limit: Int)
        /// Send the urgent notifications queued now, as many as `urgentToSend` says.
        case sendUrgent
        /// Take the handed-over outcomes and add them to the idempotency record: before settling anything, so that
        /// whatever fails next, nothing already answered is sent again.
        case recordOutcomes
        /// Drop completions of jobs delivered on an older broker connection, their outcomes recorded: an
        /// acknowledgement now would mean nothing, and the broker redelivers those jobs.
        case discardStale(Int)
        /// Publish what the completed jobs produced and settle them.
        case finishCompleted
        /// Publish again what the broker did not take.
        case publishHeld
    }

    /// What the second half of a turn does, in this order.
    public enum EndAction: Equatable, Sendable {
        /// Hand this many queued notifications of each lane to APNs (within the rate limit, if there is one).
        case send(urgent: Int, bulk: Int)
        /// Start up to this many of the bulk jobs read but not started.
        case startBulk(limit: Int)
        /// Resolve and queue the next piece of a large job of this lane.
        case resolvePiece(JobLane)
        case probe
        case reportStatistics
        case logProgress
        /// Nothing to do before this many seconds (or a wake-up, or the broker sending something if
        /// `watchingBroker`).
        case wait(seconds: Double, watchingBroker: Bool)
    }

    /// What the loop did that the core must know.
    public enum Event: Equatable, Sendable {
        /// Jobs now waiting for outcomes (read and started).
        case jobsStarted(Int)
        /// Jobs acknowledged or otherwise settled for good.
        case jobsSettled(Int)
        /// The rate limit granted these lanes less than asked: nothing more of theirs may go before the next window.
        case rateLimited([JobLane], nextWindowIn: Double, at: Date)
        case probed(Date)
        case reported(Date)
        case progressLogged(Date)
    }

    public let settings: Settings
    /// Which broker connection this core serves: completions from another are stale.
    public let generation: Int
    /// Jobs delivered on this connection and not yet settled.
    public private(set) var jobsInFlight = 0
    public private(set) var stopDeadline: Date?
    /// Per lane, when the rate limit opens again for it.
    private var nextWindowAt: [JobLane: Date] = [:]
    /// Per lane, notifications handed to APNs and unanswered at most (`noteStreamCapacity`).
    public private(set) var inFlightWindow: LaneCounts
    private var lastProbe: Date
    private var lastReport: Date
    private var lastProgress: Date

    public init(settings: Settings, generation: Int, now: Date) {
        self.settings = settings
        self.generation = generation
        inFlightWindow = LaneCounts(
            urgent: settings.maximumNotificationsInFlight, bulk: settings.maximumNotificationsInFlight)
        lastProbe = now
        lastReport = .distantPast
        lastProgress = now
    }

    /// What a lane's connections can carry at once (nil: unknown). A lane hands APNs no more than that and a batch
    /// (so that a stream that frees finds the next request there), within `maximumNotificationsInFlight`: the rest
    /// waits here as job and index, a few bytes each, rather than as requests queued behind the streams APNs allows
    /// (which it lowers as it goes, to one stream at times), each holding its request, its stream and nghttp2's copy.
    public mutating func noteStreamCapacity(_ capacity: Int?, of lane: JobLane) {
        let limit = settings.maximumNotificationsInFlight
        inFlightWindow[lane] = capacity.map { min(limit, max(1, $0) + settings.sendBatchLimit) } ?? limit
    }

    /// Answers wake the broker thread to send more when a lane's notifications in flight fall to this: each time a
    /// batch's worth of room opened (or half the window, for small windows), so hand-overs stay small and an urgent
    /// one never waits long behind a bulk one.
    public func sendMoreAt(_ lane: JobLane) -> Int {
        let window = inFlightWindow[lane]
        return max(window - settings.sendBatchLimit, window / 2)
    }

    public var isStopping: Bool { stopDeadline != nil }

    public func isCurrent(generation: Int) -> Bool { generation == self.generation }

    public mutating func handle(_ event: Event) {
        switch event {
        case .jobsStarted(let count): jobsInFlight += count
        case .jobsSettled(let count): jobsInFlight -= count
        case .rateLimited(let lanes, let wait, let now):
            for lane in lanes { nextWindowAt[lane] = now.addingTimeInterval(wait) }
        case .probed(let now): lastProbe = now
        case .reported(let now): lastReport = now
        case .progressLogged(let now): lastProgress = now
        }
    }

    /// The first half of a turn: stopping, the idempotency record, completions, held publications, reading.
    public mutating func beginTurn(_ observation: Observation) -> [BeginAction] {
        let now = observation.now
        var actions: [BeginAction] = []
        if observation.stopRequested && stopDeadline == nil {
            stopDeadline = now.addingTimeInterval(settings.shutdownTimeout)
            actions.append(.announceStop(jobsInFlight: jobsInFlight))
            actions.append(.requeueUnstarted)
        }
        if let deadline = stopDeadline {
            if jobsInFlight == 0 && observation.heldDue == nil { return actions + [.exit(.drained)] }
            if now > deadline { return actions + [.exit(.deadlinePassed(unfinishedJobs: jobsInFlight))] }
        }
        // While stopping, deliveries are left unread: the broker gives them to another worker.
        if !isStopping { actions += [.readDeliveries(limit: settings.prefetch), .sendUrgent] }
        if observation.outcomesWaiting { actions.append(.recordOutcomes) }
        if observation.staleCompletions > 0 { actions.append(.discardStale(observation.staleCompletions)) }
        if observation.completedJobs > 0 { actions.append(.finishCompleted) }
        if let due = observation.heldDue, due <= now { actions.append(.publishHeld) }
        return actions
    }

    /// How many urgent notifications to hand to APNs now: what is queued, within the lane's room in flight, the batch
    /// limit and the rate limit's window.
    public mutating func urgentToSend(queued: Int, inFlight: Int, now: Date) -> Int {
        sendable(.urgent, queued: queued, inFlight: inFlight, now: now)
    }

    /// A lane's notifications that may go now; a window that opened is forgotten.
    private mutating func sendable(_ lane: JobLane, queued: Int, inFlight: Int, now: Date) -> Int {
        let room = inFlightWindow[lane] - inFlight
        let windowOpen = nextWindowAt[lane].map { now >= $0 } ?? true
        guard queued > 0 && room > 0 && windowOpen else { return 0 }
        nextWindowAt[lane] = nil
        return min(queued, room, settings.sendBatchLimit)
    }

    /// Of a batch just read (and admitted past the suspects): the urgent jobs start at once, the bulk jobs wait
    /// their turn (`startBulk`).
    public static func arrivals(_ batch: [JobDelivery]) -> (startNow: [JobDelivery], later: [JobDelivery]) {
        (batch.filter { $0.lane == .urgent }, batch.filter { $0.lane == .bulk })
    }

    /// The second half: sending within the bounds, starting bulk jobs, the chores, and the wait. `deliveriesRead`:
    /// how many deliveries this turn read (then the loop goes round at once: more may be waiting, and so after
    /// starting bulk jobs). While `suspectsActive` (a suspect job waits or runs alone), no bulk job starts.
    /// `piecesWaiting`: large jobs under way with users still to resolve, per lane; the next piece of one is resolved
    /// once its lane has less than a window queued, urgent first (the loop keeps one piece out at a time, so the first
    /// lane named gets it).
    public mutating func endTurn(
        now: Date, deliveriesRead: Int, queued: LaneCounts, inFlight: LaneCounts,
        unstartedBulkJobs: Int, suspectsActive: Bool = false, piecesWaiting: LaneCounts = LaneCounts(),
        heldDue: Date?
    ) -> [EndAction] {
        var actions: [EndAction] = []
        var sending = LaneCounts()
        // A lane cut to the batch limit with more to send and room for it: round again at once, not after a wait.
        var more = false
        for lane in JobLane.allCases {
            sending[lane] = sendable(lane, queued: queued[lane], inFlight: inFlight[lane], now: now)
            let room = inFlightWindow[lane] - inFlight[lane]
            more = more || (sending[lane] > 0 && sending[lane] < min(queued[lane], room))
        }
        if sending.total > 0 { actions.append(.send(urgent: sending.urgent, bulk: sending.bulk)) }
        // After urgent work has gone: bulk jobs go to the preparer a batch at a time, and only while the bulk lane has
        // less than a window queued (enough to keep its notifications flowing, and no more held in memory).
        let startingBulk =
            !isStopping && !suspectsActive && unstartedBulkJobs > 0
            && queued.bulk < settings.maximumNotificationsInFlight
        if startingBulk { actions.append(.startBulk(limit: min(unstartedBulkJobs, settings.bulkJobsPerTurn))) }
        let resolving = JobLane.allCases.filter {
            piecesWaiting[$0] > 0 && queued[$0] < settings.maximumNotificationsInFlight
        }
        actions += resolving.map { .resolvePiece($0) }
        if now.timeIntervalSince(lastProbe) >= settings.probeInterval { actions.append(.probe) }
        if deliveriesRead > 0 || startingBulk || more || !resolving.isEmpty { return actions }
        if now.timeIntervalSince(lastReport) >= settings.reportInterval { actions.append(.reportStatistics) }
        if now.timeIntervalSince(lastProgress) >= settings.progressInterval { actions.append(.logProgress) }
        // Stopping with nothing left: round again at once, to leave.
        if isStopping && jobsInFlight == 0 && heldDue == nil { return actions }
        let windows = JobLane.allCases.compactMap { queued[$0] > 0 ? nextWindowAt[$0] : nil }
        let wakeAt = (windows + [heldDue, stopDeadline].compactMap { $0 }).min()
        let seconds = min(1, wakeAt.map { max(0.001, $0.timeIntervalSince(now)) } ?? 1)
        actions.append(.wait(seconds: seconds, watchingBroker: !isStopping))
        return actions
    }
}

/// A count per lane.
public struct LaneCounts: Sendable, Equatable {
    public var urgent: Int
    public var bulk: Int

    public init(urgent: Int = 0, bulk: Int = 0) {
        self.urgent = urgent
        self.bulk = bulk
    }

    public subscript(lane: JobLane) -> Int {
        get { lane == .urgent ? urgent : bulk }
        set { if lane == .urgent { urgent = newValue } else { bulk = newValue } }
    }

    public var total: Int { urgent + bulk }
}
