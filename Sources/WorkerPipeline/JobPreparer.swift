import Foundation
import Telemetry
import Threads

/// What starting a batch of jobs needs before the broker thread can queue their notifications: the jobs decoded (or
/// refused, with the reason), and the users of the small ones resolved in the token cache (a large job's users are
/// resolved a piece at a time, `JobAssembly`).
struct PreparedBatch {
    var jobs: [(delivery: JobDelivery, job: PushJob)]
    var rejected: [(JobDelivery, String)]
    /// Jobs whose `send_at` has not come: not resolved, they go back to wait in the broker (`JobSchedule`).
    var scheduled: [(delivery: JobDelivery, job: PushJob)] = []
    var resolved: ResolvedUsers
    /// The update tokens of the Live Activities the jobs address (`activity`), by activity id.
    var activities = ResolvedUsers(tokens: [:])
    /// The deliveries handed in, for giving them back unstarted.
    var deliveries: [JobDelivery]
    /// Jobs with a `local_window`, by delivery tag: how their users' hours cut them (`jobs` holds each with only the
    /// users and tokens inside their hours now).
    var windows: [UInt64: WindowSplit] = [:]
    /// Windowed jobs with a user whose time zone sits on a Redis node that does not answer: they wait (`StoreWaits`).
    var waitingForTimeZones: [JobDelivery] = []

    /// Decodes `batch` and resolves the users of every job of at most `usersPerPiece` users, in one round trip to
    /// `tokens`. Only a lost connection throws.
    /// A job whose topic `sender` cannot send (no credential serves it) is refused with the sender's reason.
    static func prepare(
        _ batch: [JobDelivery], tokens: any TokenStore, settings: WorkerSettings,
        resolver: TargetResolver, sender: any NotificationSender, logger: Logger
    ) throws -> PreparedBatch {
        var jobs: [(delivery: JobDelivery, job: PushJob)] = []
        var rejected: [(JobDelivery, String)] = []
        var scheduled: [(delivery: JobDelivery, job: PushJob)] = []
        let now = Date().timeIntervalSince1970
        var services: [String: TopicService] = [:]
        // Most batches hold one topic: the last one's service is kept at hand, without hashing the topic per job.
        var lastService: (topic: String, service: TopicService)?
        for delivery in batch {
            do {
                var job = try PushJob.decode(
                    delivery.body, defaultTopic: settings.defaultTopic,
                    fallbackID: delivery.properties.idForJob ?? "delivery-\(delivery.tag)")
                if let exitOnJobID = settings.exitOnJobID, job.id == exitOnJobID {
                    logger.critical("test fault: exiting on this job", ["job.id": job.id])
                    // At once, as a crash would: exit() ran the process's exit handlers (OpenSSL's cleanup among
                    // them) while the HTTP/2 thread still used them, which now and then ended in SIGSEGV, not 70.
                    _exit(70)
                }
                let service: TopicService
                if let lastService, lastService.topic == job.topic {
                    service = lastService.service
                } else {
                    service = services[job.topic] ?? sender.service(forTopic: job.topic)
                    services[job.topic] = service
                    lastService = (job.topic, service)
                }
                switch service {
                case .served(let rateGroup):
                    job.rateGroup = rateGroup
                    if JobSchedule.isDue(job.sendAt, now: now) {
                        jobs.append((delivery, job))
                    } else {
                        scheduled.append((delivery, job))
                    }
                case .unserved(let reason):
                    rejected.append((delivery, reason))
                }
            } catch {
                rejected.append((delivery, error.description))
            }
        }
        let (windows, waitingForTimeZones) = try cutByLocalHours(&jobs, tokens: tokens, logger: logger)
        let small = jobs.map(\.job).filter { !Self.isLarge($0, usersPerPiece: settings.core.usersPerPiece) }
        let users = resolver.usersToResolve(small)
        let resolved = users.isEmpty ? ResolvedUsers(tokens: [:]) : try tokens.resolve(users)
        let activityIDs = jobs.compactMap { $0.job.retryTargets == nil ? $0.job.activity : nil }
        let activities = activityIDs.isEmpty ? ResolvedUsers(tokens: [:]) : try tokens.resolveActivities(activityIDs)
        return PreparedBatch(
            jobs: jobs, rejected: rejected, scheduled: scheduled, resolved: resolved,
            activities: activities, deliveries: batch, windows: windows,
            waitingForTimeZones: waitingForTimeZones)
    }

    /// Jobs with a `local_window` keep only the users (and tokens) inside their hours now; the cut is noted by
    /// delivery tag. Jobs with a user whose time zone cannot be read now come out of `jobs`, to wait.
    private static func cutByLocalHours(
        _ jobs: inout [(delivery: JobDelivery, job: PushJob)], tokens: any TokenStore,
        logger: Logger
    ) throws
        -> (windows: [UInt64: WindowSplit], waiting: [JobDelivery])
    {
        var windows: [UInt64: WindowSplit] = [:]
        var waiting: [JobDelivery] = []
        let windowed = jobs.indices.filter { jobs[$0].job.localWindow != nil && jobs[$0].job.retryTargets == nil }
        guard !windowed.isEmpty else { return (windows, waiting) }
        let users = Array(Set(windowed.flatMap { jobs[$0].job.users }))
        let (zones, unavailable) = try tokens.timeZones(of: users)
        let now = Date()
        var leaving = Set<Int>()
        for index in windowed {
            let (delivery, job) = jobs[index]
            guard let window = job.localWindow else { continue }
            if !unavailable.isEmpty && job.users.contains(where: unavailable.contains) {
                waiting.append(delivery)
                leaving.insert(index)
                continue
            }
            let split = WindowSplit(job, window: window, zones: zones, now: now, logger: logger)
            windows[delivery.tag] = split
            if !split.isWhole { jobs[index].job = job.reaching(users: split.users, tokens: split.tokens) }
        }
        if !leaving.isEmpty { jobs = jobs.indices.filter { !leaving.contains($0) }.map { jobs[$0] } }
        return (windows, waiting)
    }

    /// A job whose users are resolved and sent a piece at a time.
    static func isLarge(_ job: PushJob, usersPerPiece: Int) -> Bool {
        job.retryTargets == nil && job.users.count > usersPerPiece
    }
}

/// The broker thread's helper for the heavy part of bulk work: decoding bulk jobs and resolving their users,
/// resolving the pieces of large jobs, and writing their pieces' outcomes to the idempotency record, on a thread of its
/// own with a store connection of its own. The broker thread meanwhile keeps reading, starting and sending urgent
/// work: a 1 MB campaign job takes milliseconds to decode and a piece of users a round trip to Redis, and neither
/// waits on it. Its thread runs at `BulkThread`'s lower priority (large urgent jobs' pieces pass through it too,
/// behind at most one bulk request).
///
/// One batch and one piece are out at a time (the broker thread asks for the next when the last came back), so what
/// it holds stays bounded by a batch and a piece; writes to the record queue in the order asked, each a piece's
/// outcomes. Results come back in the order asked, with a wake-up. A lost connection comes back as a failure, which
/// ends the session like any other. Lives and dies with a session.
final class JobPreparer: @unchecked Sendable {
    typealias Outcomes = [(jobID: String, outcomes: [SettledOutcome])]

    enum Request {
        case batch([JobDelivery])
        case piece(JobAssembly, ArraySlice<String>)
        case record(Outcomes)
    }

    enum Result {
        case batch(PreparedBatch)
        case piece(JobAssembly, ArraySlice<String>, ResolvedUsers)
        case recorded(Outcomes, RecordWrite)
        case failed(any Error)
    }

    // Invariant: `requests`, `results` and `running` under `condition`; `tokens` on the preparer's thread only. The
    // deliveries of a batch belong to that thread from `submit` until its result is taken; an assembly only passes
    // through it (its users slice is a copy), and stays the broker thread's.
    private let condition = NSCondition()
    private var requests: [Request] = []
    private var results: [Result] = []
    private var running = true
    private(set) var batchOut = false
    /// Pieces asked for and not yet taken back (the broker thread asks for one only when none is out).
    private(set) var piecesOut = 0
    /// Broker thread: outcomes asked to be recorded and not yet said written, in the order asked.
    private var recordsOut: [Outcomes] = []
    private var stopped = false
    private let tokens: any TokenStore
    private let record: any SettledOutcomes
    private let settings: WorkerSettings
    private let resolver: TargetResolver
    private let sender: any NotificationSender
    private let wakeup: Wakeup
    private let logger: Logger
    private let finished = DispatchSemaphore(value: 0)

    init(
        tokens: any TokenStore, record: any SettledOutcomes, settings: WorkerSettings, resolver: TargetResolver,
        sender: any NotificationSender, wakeup: Wakeup, logger: Logger
    ) {
        self.sender = sender
        self.logger = logger
        self.tokens = tokens
        self.record = record
        self.settings = settings
        self.resolver = resolver
        self.wakeup = wakeup
        let thread = Thread { [self] in
            BulkThread.lowerCurrentThreadPriority()
            run()
        }
        thread.name = "preparer"
        thread.start()
    }

    // MARK: broker thread

    /// Decode and resolve these bulk jobs.
    func prepare(_ batch: [JobDelivery]) {
        batchOut = true
        submit(.batch(batch))
    }

    /// Resolve these users of a large job.
    func resolve(_ users: ArraySlice<String>, of assembly: JobAssembly) {
        piecesOut += 1
        submit(.piece(assembly, users))
    }

    /// Write these outcomes to the idempotency record (after what was asked before).
    func record(_ outcomes: Outcomes) {
        recordsOut.append(outcomes)
        submit(.record(outcomes))
    }

    /// The results since the last call, in the order asked.
    func takeResults() -> [Result] {
        condition.lock()
        let taken = results
        results.removeAll()
        condition.unlock()
        for result in taken {
            switch result {
            case .batch: batchOut = false
            case .piece: piecesOut -= 1
            case .recorded: recordsOut.removeFirst()
            case .failed: break
            }
        }
        return taken
    }

    /// The batch not begun yet, if any: given back by a stop. (A batch begun comes back as a result.)
    func withdrawBatch() -> [JobDelivery] {
        condition.lock()
        defer { condition.unlock() }
        guard let index = requests.firstIndex(where: { if case .batch = $0 { true } else { false } }),
            case .batch(let batch) = requests.remove(at: index)
        else { return [] }
        batchOut = false
        return batch
    }

    /// Ends the thread after the request under way (a store call ends within its connection's timeout); what is still
    /// asked is dropped (the session that asked is over), but for the writes to the record when `finishingWrites` (an
    /// orderly stop). Returns the outcomes it was asked to record and did not say written (some may be: a record holds
    /// each once). Once only; later calls return nothing.
    func stop(finishingWrites: Bool = false) -> Outcomes {
        guard !stopped else { return [] }
        stopped = true
        condition.lock()
        running = false
        if finishingWrites {
            requests.removeAll { request in
                switch request {
                case .record: false
                case .batch, .piece: true
                }
            }
        } else {
            requests.removeAll()
        }
        condition.signal()
        condition.unlock()
        finished.wait()
        // Written, not yet taken: no longer out, but for the jobs whose node did not answer.
        var unwritten: Outcomes = []
        for result in results {
            guard case .recorded(let outcomes, let written) = result else { continue }
            recordsOut.removeFirst()
            unwritten += outcomes.filter { written.unavailable.contains($0.jobID) }
        }
        results.removeAll()
        defer { recordsOut.removeAll() }
        return recordsOut.flatMap { $0 } + unwritten
    }

    private func submit(_ request: Request) {
        condition.lock()
        requests.append(request)
        condition.signal()
        condition.unlock()
    }

    // MARK: the preparer's thread

    private func run() {
        defer { finished.signal() }
        while let request = next() {
            let result: Result
            do {
                switch request {
                case .batch(let batch):
                    result = .batch(
                        try PreparedBatch.prepare(
                            batch, tokens: tokens, settings: settings,
                            resolver: resolver, sender: sender, logger: logger))
                case .piece(let assembly, let users):
                    result = .piece(assembly, users, try tokens.resolve(Array(users)))
                case .record(let outcomes):
                    result = .recorded(outcomes, try record.record(outcomes))
                }
            } catch {
                result = .failed(error)
            }
            condition.lock()
            results.append(result)
            condition.unlock()
            wakeup.signal()
            if case .failed = result { return }
        }
    }

    private func next() -> Request? {
        condition.lock()
        defer { condition.unlock() }
        while running && requests.isEmpty { condition.wait() }
        // Stopped, only what `stop` kept is left.
        return requests.isEmpty ? nil : requests.removeFirst()
    }
}
