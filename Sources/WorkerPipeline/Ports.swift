import APNsModel
import Foundation

// What the pipeline needs from the systems around it, in its own words. Adapters implement these over the wrappers
// (`AMQPBroker` over RabbitMQ, `RedisStore` over Redis) and the executables wire them in through a `WorkerSession`
// factory: another broker, a cluster-aware connection or another store is one new type, not an edit of the pipeline.
// Every implementation is owned by one thread (the worker's broker thread, or its job preparer's for the second token
// store) and may block; none is shared across threads.

/// Something that answers a round trip now: readiness is built on it.
public protocol Probing: AnyObject {
    /// One round trip within a short timeout; throws if there is no answer.
    func probe() throws
}

/// The source of jobs and the sink of what they produce: one broker connection.
public protocol JobBroker: Probing {
    /// Deliveries and notices that have arrived, without waiting; at most `limit` deliveries.
    func receive(limit: Int) throws -> [BrokerNotice]
    /// Whether `receive` has something without reading the socket.
    var hasBufferedInput: Bool { get }
    /// Becomes readable when the broker sends something.
    var readableDescriptor: Int32 { get }
    /// Publishes, waits for the broker's confirms, and says per publication what became of it. Whatever the worker
    /// relies on that went missing (a deleted queue) is declared again, so that a later attempt finds it.
    func publish(_ publications: [Publication]) throws -> [PublicationOutcome]
    /// Settles deliveries for good: at once, or held back a little to go with an older delivery's acknowledgement
    /// in one frame, until `acknowledgementsDue` at the latest (and sent by `close`).
    func acknowledge(_ tags: [UInt64]) throws
    /// When acknowledgements held back must go out, if any are held: the session loop waits no longer.
    var acknowledgementsDue: Date? { get }
    /// Sends the acknowledgements held back that are due by `now`.
    func acknowledgeHeld(dueBy now: Date) throws
    /// The acknowledgement frames sent on this connection since the last call.
    func takeAcknowledgementFrames() -> AcknowledgementFrames
    /// Gives a delivery back for another worker.
    func requeue(_ tag: UInt64) throws
    /// Each lane's queue as the broker sees it now (a passive declare each: the readiness round trip): messages
    /// ready, and consumers.
    func laneQueues() throws -> LaneQueues
    func close()
    /// What this connection is, for the log (never a password).
    var logMetadata: [String: String] { get }
}

/// Acknowledgement frames sent to the broker: a multiple one settles every delivery up to its own, a single one a
/// delivery that could not wait for an older one.
public struct AcknowledgementFrames: Sendable, Equatable {
    public var multiple = 0
    public var single = 0

    public init(multiple: Int = 0, single: Int = 0) {
        self.multiple = multiple
        self.single = single
    }
}

/// Users' device tokens (the cache other systems fill as apps register).
public protocol TokenStore {
    /// Every user's tokens with what each serves; users whose entry cannot be read are named apart. Only a lost
    /// connection throws. Every token returned is a device token (`APNsNotification.scanDeviceToken` says valid):
    /// the worker sends them without scanning them again, as it does a job's own tokens, checked as it is decoded.
    func resolve(_ users: [String]) throws -> ResolvedUsers
    /// The update tokens of these Live Activities (by activity id); an activity whose entry cannot be read has
    /// none. Only a lost connection throws.
    func resolveActivities(_ activities: [String]) throws -> ResolvedUsers
    /// The time zones users registered (for jobs with a `local_window`): a user without one is absent; users whose
    /// node does not answer are named apart (their jobs wait, as for their tokens). Only a lost connection throws.
    func timeZones(of users: [String]) throws -> (zones: [String: String], unavailable: Set<String>)
    /// Takes tokens out, each only if what is known of it still says so. Only a lost connection throws.
    func remove(_ removals: [TokenRemoval]) throws -> [CacheChange]
}

/// A job's outcome that needs no second sending: the token, or a dead token with what its event needs.
public enum SettledOutcome: Sendable, Equatable {
    /// Delivered (or, as written by older workers, any final outcome but a dead token).
    case done(String)
    /// Sending again cannot help: the reason, for the job's summary. Indirect, like `dead`: the common cases then
    /// need no more than a String, and a job's progress, which holds one, fits glibc's fast bins.
    indirect case failed(String, reason: String)
    /// Not handed to APNs by the job's deadline.
    case expired(String)
    indirect case dead(DeviceTarget, APNsResponse)
    /// The job's summary went to its reply_to queue: a redelivery publishes none.
    case summarySent
}

/// What an earlier delivery of a job settled.
public struct Settled: Sendable {
    /// Every token with a final outcome, whatever it was.
    public var tokens: Set<String>
    public var dead: [(target: DeviceTarget, response: APNsResponse)]
    public var summarySent: Bool
    /// What the others became, for the job's summary: it counts every delivery's notifications.
    public var earlier: EarlierOutcomes

    public init(
        tokens: Set<String> = [], dead: [(target: DeviceTarget, response: APNsResponse)] = [],
        summarySent: Bool = false, earlier: EarlierOutcomes = EarlierOutcomes()
    ) {
        self.tokens = tokens
        self.dead = dead
        self.summarySent = summarySent
        self.earlier = earlier
    }

    /// Notes one outcome read from the record.
    public mutating func add(_ outcome: SettledOutcome) {
        switch outcome {
        case .done(let token):
            if tokens.insert(token).inserted { earlier.delivered += 1 }
        case .failed(let token, let reason):
            if tokens.insert(token).inserted { earlier.failedByReason[reason, default: 0] += 1 }
        case .expired(let token):
            if tokens.insert(token).inserted { earlier.expired += 1 }
        case .dead(let target, let response):
            if tokens.insert(target.token).inserted {
                dead.append((target, response))
                earlier.dead += 1
            }
        case .summarySent:
            summarySent = true
        }
    }
}

/// How many final outcomes of each kind a job's earlier deliveries had.
public struct EarlierOutcomes: Sendable, Equatable {
    public var delivered = 0
    public var expired = 0
    public var failedByReason: [String: Int] = [:]
    /// Dead tokens, also listed whole in `Settled.dead`.
    public var dead = 0

    public init() {}

    public var failed: Int { failedByReason.values.reduce(0, +) }
    /// Every final outcome.
    public var count: Int { delivered + expired + failed + dead }
}

/// What a store said to one request about one key, or keys on one node.
public enum StoreAnswer<Value: Sendable>: Sendable {
    case answered(Value)
    /// The store refused it (a key of the wrong type that another system wrote): a data error.
    case refused(String)
    /// The Redis node holding the key did not answer (a cluster master lost): nothing was done.
    case unavailable
}

/// What became of outcomes added to the idempotency record.
public struct RecordWrite: Sendable, Equatable {
    /// Jobs whose record the store refused, with why (a data error: a redelivery would send them again).
    public var refused: [String: String]
    /// Jobs whose record's node did not answer: their outcomes are not written yet.
    public var unavailable: Set<String>

    public init(refused: [String: String] = [:], unavailable: Set<String> = []) {
        self.refused = refused
        self.unavailable = unavailable
    }
}

/// What earlier deliveries of jobs settled, as the idempotency record says.
public struct SettledLookup: Sendable {
    public var settled: [String: Settled]
    /// Jobs whose record the store cannot read (a key of the wrong type), with why: they count as having nothing
    /// settled.
    public var unreadable: [String: String]
    /// Jobs whose record's node did not answer: what they settled is unknown.
    public var unavailable: Set<String>

    public init(settled: [String: Settled] = [:], unreadable: [String: String] = [:], unavailable: Set<String> = []) {
        self.settled = settled
        self.unreadable = unreadable
        self.unavailable = unavailable
    }
}

/// The idempotency record: per job, the outcomes already settled, so that a redelivered job sends nothing twice;
/// and per message, the history that tells a job that stops workers from one that met a lost connection. Five
/// ports, one concern each; the store's adapter is all five.
///
/// Where the store's node for a key does not answer (a cluster master lost), what concerns that key is skipped: a
/// delivery counted as none (the job is handled as usual, not as a suspect), a mark not set, a job not remembered as
/// settled; what the pipeline must know is said in the answers (`RecordWrite`, `SettledLookup`).
public typealias IdempotencyRecord = SettledOutcomes & DeliveryHistory & RunningMarks & AloneMarks & RecentlySettledJobs

/// What each job's deliveries already settled.
public protocol SettledOutcomes {
    /// Adds outcomes; says which jobs' records were refused or not written. Only a lost connection throws.
    func record(_ batches: [(jobID: String, outcomes: [SettledOutcome])]) throws -> RecordWrite
    /// What earlier deliveries settled, per job; and the jobs whose record cannot be read, or whose node does not
    /// answer. Only a lost connection throws.
    func settled(jobIDs: [String]) throws -> SettledLookup
}

/// How often each message came back, and how often an orderly stop gave it back.
public protocol DeliveryHistory {
    /// Counts one more delivery of each message (a key that stays the same across its deliveries) for the whole
    /// fleet, where the broker does not count them; returns the deliveries counted so far per key, and the keys whose
    /// count cannot be read. Only a lost connection throws.
    func countRedeliveries(of keys: [String]) throws -> (counts: [String: Int], unreadable: [String: String])
    /// This worker gives these jobs back in an orderly stop (a SIGTERM, a rolling restart): their next delivery is
    /// no sign of a job that stops workers.
    func gaveBack(_ keys: [String]) throws
    /// How many of each job's deliveries were given back in orderly stops.
    func givenBack(_ keys: [String]) throws -> [String: Int]
    /// The job is parked: its history goes, so that the same job sent again after a fix starts afresh.
    func forget(_ key: String) throws
}

/// Marks on redelivered jobs while they run: one found on a later delivery says the worker that ran it died.
public protocol RunningMarks {
    /// These redelivered jobs start now: each marked until it settles or is handed back (`clearRunning`), so that a
    /// mark found on a later delivery says the worker that ran it died with it.
    func markRunning(_ keys: [String]) throws
    /// The jobs settled, or were handed back by a worker that did not die: their marks go.
    func clearRunning(_ keys: [String]) throws
    /// Which of these jobs carry a mark: started on an earlier delivery by a worker that then died.
    func ranAndDied(_ keys: [String]) throws -> Set<String>
}

/// Marks on suspect jobs a worker runs alone: one found on a later delivery says the job stops workers.
public protocol AloneMarks {
    /// Notes that a worker starts this job alone (no other job in progress until it settles), until `settledAlone`.
    func startingAlone(_ key: String) throws
    /// The job settled (or its worker stopped without dying): its mark goes.
    func settledAlone(_ key: String) throws
    /// The keys whose last delivery was started alone and never settled: the worker running it died.
    func diedAlone(_ keys: [String]) throws -> Set<String>
}

/// Jobs settled in the last half minute or so, fleet-wide, so that a copy of one is not sent again.
public protocol RecentlySettledJobs {
    /// These jobs were settled (acknowledged) just now: remembered for half a minute or so, long enough for a copy
    /// its publisher made after a failover (queued right after the original) to be recognised.
    func settledRecently(_ jobIDs: [String]) throws
    /// Which of these jobs were settled in the last half minute or so.
    func recentlySettled(_ jobIDs: [String]) throws -> Set<String>
    /// Claims parts of windowed jobs as they start (`WindowSplit.Part.key`), fleet-wide and for as long as a part
    /// can wait: returns the keys claimed now; a key claimed before is a copy of a part that started already (its
    /// settlement's publications made again). A key whose node does not answer counts as claimed now. Only a lost
    /// connection throws.
    func claimWindowParts(_ keys: [String]) throws -> Set<String>
    /// Claims scheduled jobs as they start, at their `send_at` (`<job id>:<send_at>`), the same way: a key claimed
    /// before is another delivery of a job that started already (its publisher's copy, which came back with it).
    func claimScheduledStarts(_ keys: [String]) throws -> Set<String>
}

/// What a rate limiter grants.
public enum RateReservation: Sendable, Equatable {
    /// Permits granted now, per lane; the next window opens in `nextWindowIn` seconds.
    case granted(urgent: Int, bulk: Int, nextWindowIn: Double)
    /// The store refused the reservation (a data error): nothing may go until it is asked again.
    case refused(String)
}

extension RateReservation {
    /// The lanes granted fewer permits than `asked`: only those wait for the next window. A refusal holds both.
    public func lanesHeldBack(asked: LaneCounts) -> [JobLane] {
        switch self {
        case .granted(let urgent, let bulk, _):
            let granted = LaneCounts(urgent: urgent, bulk: bulk)
            return JobLane.allCases.filter { granted[$0] < asked[$0] }
        case .refused:
            return JobLane.allCases
        }
    }
}

/// A rate shared by every worker, urgent work first: bulk work gets what urgent work leaves.
public protocol RateLimiter {
    /// Permits for up to `urgent` urgent and `bulk` bulk notifications, in one round trip. Only a lost connection
    /// throws.
    func reserve(urgent: Int, bulk: Int) throws -> RateReservation
}

/// The fleet's recent answers that judge a token, shared by every worker: what the mass-invalidation guard weighs a
/// wave of 400 mismatches spread over many small jobs by.
public protocol InvalidationWindow {
    /// Adds answers to the window and returns its totals over the last minute and the last hour, these included;
    /// refused (a key of the wrong type) or unavailable, the guard removes nothing on a guess. Only a lost connection
    /// throws.
    func add(_ counts: InvalidationCounts) throws -> StoreAnswer<FleetInvalidationCounts>
}

/// One credential's connections to one APNs environment, by the credential's name (`TEAMID/KEYID` or
/// `certificate:<file name>`): what a starting worker opens ahead of the first push when the fleet sent with it lately.
public struct SendingPool: Hashable, Sendable {
    public var credential: String
    public var environment: APNsEnvironment

    public init(credential: String, environment: APNsEnvironment) {
        self.credential = credential
        self.environment = environment
    }
}

/// A job an operator cancelled (`apns-worker jobs cancel`), and when (UNIX seconds).
public struct CancelledJob: Sendable, Equatable {
    public var jobID: String
    public var at: Double

    /// How long the fleet keeps a cancellation (seconds): a copy of the job that comes back later is sent.
    public static let retention = 7 * 24 * 3600

    public init(jobID: String, at: Double) {
        self.jobID = jobID
        self.at = at
    }
}

/// The fleet's record of cancelled jobs: every worker reads what was cancelled since it last asked.
public protocol JobCancellations {
    /// The jobs cancelled at `since` or later (UNIX seconds), oldest first; nil: every cancellation still kept. Only a
    /// lost connection throws.
    func cancelled(since: Double?) throws -> StoreAnswer<[CancelledJob]>
}

/// What one worker adds to a job's progress since its last report (`apns-worker jobs show`).
public struct JobProgressDelta: Sendable, Equatable {
    /// The counters every worker adds to, by the names the fleet's record and `jobs show` use.
    public enum Counter: String, Sendable, CaseIterable {
        case resolved, sent, delivered, dead, failed
        case heldBack = "held_back"
        case expired, cancelled
        /// Users and tokens of a windowed job waiting for their hours: parts published add, parts that came subtract.
        case waitingForWindow = "waiting_for_window"
    }

    /// Jobs with fewer users and tokens than this have no progress record: their summary says all there is, and a
    /// store write per single-token job would cost more than its request.
    public static let minimumTargets = 1_000

    public var jobID: String
    /// The job's users and tokens as it names them: an estimate of its notifications, for the ETA.
    public var targets = 0
    /// When this worker first counted something of the job (UNIX seconds): the job's first update, if no worker
    /// reported it before.
    public var since: Double = 0
    /// What each counter grew (or, for `dead` once the guard held answers back, shrank) by.
    public var counts: [Counter: Int] = [:]
    /// Set when an attempt settles: its notifications waiting for another attempt.
    public var retrying: Int?
    /// The job settled with nothing left to retry.
    public var ended = false
    /// The job waits for its `send_at` (UNIX seconds).
    public var scheduledFor: Int64?
    /// The job settled cancelled: when it was cancelled (UNIX seconds), under its id or its message-id.
    public var cancelledAt: Double?
    /// The job has a `local_window`: parts of it may wait while others run.
    public var windowed = false
    /// The latest opening a part published now waits for (UNIX seconds).
    public var windowsUntil: Int64?

    public init(jobID: String) { self.jobID = jobID }

    /// Adds what `earlier` held, which the store did not take, to this delta taken since.
    public mutating func add(_ earlier: JobProgressDelta) {
        targets = max(targets, earlier.targets)
        since = since == 0 ? earlier.since : min(since, earlier.since)
        counts.merge(earlier.counts, uniquingKeysWith: +)
        retrying = retrying ?? earlier.retrying
        ended = ended || earlier.ended
        scheduledFor = scheduledFor ?? earlier.scheduledFor
        cancelledAt = cancelledAt ?? earlier.cancelledAt
        windowed = windowed || earlier.windowed
        if let until = earlier.windowsUntil { windowsUntil = max(windowsUntil ?? until, until) }
    }
}

/// The fleet's record of large jobs' progress: each worker adds what it did for a job about once a second.
public protocol JobProgressRecord {
    /// Adds `deltas` to their jobs' progress. Only a lost connection throws.
    func add(_ deltas: [JobProgressDelta]) throws -> StoreAnswer<Void>
}

/// Where the fleet's counters and live workers are kept.
public protocol StatisticsSink {
    /// Adds what happened since the last report, and per lane the longest a job taken since then had waited in its
    /// queue (milliseconds; 0: none measured). Refused (a key of the wrong type), the counts are lost; unavailable,
    /// they go with the next report. Only a lost connection throws.
    func report(_ delta: WorkerStatistics.Snapshot, longestWait: LaneCounts, worker: String) throws -> StoreAnswer<Void>
    /// Notes that these pools sent just now, for the workers that start within the next hour. Only a lost connection
    /// throws.
    func recordSending(_ pools: Set<SendingPool>) throws -> StoreAnswer<Void>
    /// The pools any worker of the fleet sent with in the last `seconds`. Only a lost connection throws.
    func sentRecently(within seconds: Double) throws -> StoreAnswer<[SendingPool]>
}

/// What happened to one of the sender's connections: the worker counts these for its metrics and readiness.
public enum ConnectionHealth: Sendable, Equatable {
    case opened
    case closed
    /// The server announced it closes the connection (GOAWAY): new requests go to another.
    case goAway
    case connectFailed
}

/// Where notifications go: APNs, over connections the sender owns, each lane's on a thread of its own (a lane's
/// thread never waits for the other lane's work).
///
/// A lane's answers arrive on that lane's thread, and so do the actions `schedule` runs for it: a job whose
/// notifications are out is owned by its lane's thread until its last answer is in. Work crosses in batches: one
/// `send` per hand-over, not one per notification.
public protocol NotificationSender: AnyObject, Sendable {
    /// Opens connections ahead of the first notification (readiness waits for one), and from now on reports what
    /// becomes of every connection.
    func start(reportingHealth: @escaping @Sendable (ConnectionHealth) -> Void)
    /// Sends a batch of one lane's notifications (each lane has connections of its own). `answer` runs once per
    /// notification, with its position in the batch, on the lane's thread: keep it short. Returns how many were
    /// handed to APNs: the others (a broken rule, no credential for their topic) are answered without a request.
    func send(_ batch: [APNsNotification], lane: JobLane, answer: @escaping @Sendable (Int, APNsResult) -> Void) -> Int
    /// Sends one broadcast (a `channel_id` job's); `answer` runs once, on the lane's thread.
    func send(
        _ broadcast: APNsBroadcast, environment: APNsEnvironment, lane: JobLane,
        answer: @escaping @Sendable (APNsResult) -> Void)
    /// Runs `action` on the lane's thread after `delay` seconds.
    func schedule(after delay: Double, lane: JobLane, _ action: @escaping @Sendable () -> Void)
    /// Whether notifications of `topic` can be sent (a credential serves it), and under which rate limit of their
    /// own. Asked once per job, on the broker or preparer thread.
    func service(forTopic topic: String) -> TopicService
    /// Closes the connections and stops the threads.
    func shutdown()
    /// The credentials and environments that sent since this was last asked.
    func takeSendingPools() -> Set<SendingPool>
    /// Whether the caller runs on `lane`'s sender thread (or serial queue): where answers arrive and scheduled work
    /// runs. For debug builds' checks of what is confined there (`LoopConfined`).
    func isOnLaneThread(_ lane: JobLane) -> Bool
    /// Opens these pools' connections now, ahead of their first push (a credential it does not have is passed over).
    func open(_ pools: [SendingPool])
    /// Notifications `lane`'s connections can carry at once, as far as APNs allows streams now and each pool may
    /// grow; nil while unknown (no connection yet). Asked every few turns, on the broker thread: keep it cheap.
    func streamCapacity(_ lane: JobLane) -> Int?
}

/// What the sender says of a topic.
public enum TopicService: Sendable, Equatable {
    /// Sent; `rateGroup`: the shared limit of whatever sends it (its credential), if it has one of its own.
    case served(rateGroup: RateGroup?)
    /// Nothing can send it: why, for the job's reason on the failed queue.
    case unserved(String)
}

/// A rate shared by every worker for part of the traffic (one credential's), beside the fleet-wide limit.
public struct RateGroup: Hashable, Sendable {
    /// Names the group's counters in the store; never a secret.
    public var name: String
    public var perSecond: Int

    public init(name: String, perSecond: Int) {
        self.name = name
        self.perSecond = perSecond
    }
}

/// One connection's worth of everything the worker talks to, opened together and dropped together.
public struct WorkerSession {
    public var broker: any JobBroker
    public var tokens: any TokenStore
    /// The same token store on a connection of its own, owned by the session's `JobPreparer` thread.
    public var preparationTokens: any TokenStore
    /// The idempotency record on the preparer's connection: the outcomes of large jobs' pieces, written off the
    /// broker thread.
    public var preparationRecord: any SettledOutcomes
    public var record: any IdempotencyRecord
    public var statistics: any StatisticsSink
    public var rateLimiter: (any RateLimiter)?
    /// The shared limiter of a rate group (a credential's own limit), on the same store.
    public var groupRateLimiter: ((RateGroup) -> any RateLimiter)?
    public var invalidationWindow: any InvalidationWindow
    /// Jobs operators cancelled; nil: none can be (a store without the record).
    public var cancellations: (any JobCancellations)?
    /// Large jobs' progress, fleet-wide; nil: not kept.
    public var progress: (any JobProgressRecord)?
    /// The store's round trip, for readiness.
    public var store: any Probing
    /// For the log line that says the worker consumes.
    public var logMetadata: [String: String]

    public init(
        broker: any JobBroker, tokens: any TokenStore, preparationTokens: any TokenStore,
        preparationRecord: any SettledOutcomes, record: any IdempotencyRecord,
        statistics: any StatisticsSink, rateLimiter: (any RateLimiter)?,
        invalidationWindow: any InvalidationWindow, store: any Probing, logMetadata: [String: String],
        groupRateLimiter: ((RateGroup) -> any RateLimiter)? = nil,
        cancellations: (any JobCancellations)? = nil, progress: (any JobProgressRecord)? = nil
    ) {
        self.progress = progress
        self.groupRateLimiter = groupRateLimiter
        self.cancellations = cancellations
        self.invalidationWindow = invalidationWindow
        self.broker = broker
        self.tokens = tokens
        self.preparationTokens = preparationTokens
        self.preparationRecord = preparationRecord
        self.record = record
        self.statistics = statistics
        self.rateLimiter = rateLimiter
        self.store = store
        self.logMetadata = logMetadata
    }
}

/// A connection refused for what its settings say (credentials, a virtual host, a database): waiting will not help.
/// Adapters throw it; before the first session, the worker gives up with it (the executables exit 78).
public struct ConnectionRefused: Error, Sendable, CustomStringConvertible {
    /// Which setting to fix, as the configuration names it (filled in by whoever knows the names).
    public var system: System
    public var message: String
    /// The wrapper's own error, for whoever knows which setting it concerns.
    public var cause: (any Error & Sendable)?

    public enum System: Sendable { case broker, store }

    public init(_ system: System, _ message: String, cause: (any Error & Sendable)? = nil) {
        self.system = system
        self.message = message
        self.cause = cause
    }

    public var description: String { message }
}

/// An error that says which system failed, the broker or the store: the assembly makes the adapters' errors conform,
/// so that /metrics can say which one the worker cannot reach.
public protocol SystemFailure: Error {
    var failedSystem: ConnectionRefused.System { get }
}

extension ConnectionRefused: SystemFailure {
    public var failedSystem: System { system }
}

/// A port that answered a batch with another number of results than it was asked for: its adapter is wrong, and
/// no result can be trusted to belong to its question. The session ends (the jobs under way come back, to be
/// settled by the rules), rather than a job left unsettled without a word.
public struct PortAnswerMismatch: SystemFailure, CustomStringConvertible {
    public let failedSystem: ConnectionRefused.System
    public let description: String

    /// `answers`, if there is one per question.
    static func checked<Answer>(
        _ answers: [Answer], asked: Int, of system: ConnectionRefused.System,
        _ call: String
    ) throws(PortAnswerMismatch) -> [Answer] {
        guard answers.count == asked else {
            throw PortAnswerMismatch(
                failedSystem: system,
                description: "\(call) answered \(answers.count) results for \(asked) questions")
        }
        return answers
    }
}
