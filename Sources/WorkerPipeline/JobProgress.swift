import APNsModel
import Synchronization
import Telemetry

#if canImport(Glibc)
    import Glibc
#endif

/// One job on its way: which notifications still lack an outcome, and what the others became.
///
/// Built on the broker thread, then handed to its lane's sender thread, which alone mutates it until the
/// last outcome is in; then handed back through the worker's completion queue. Hand-offs go through the loop's
/// task queue and a Mutex, which order the memory accesses.
final class JobProgress: @unchecked Sendable {
    let job: PushJob
    let delivery: JobDelivery
    /// The broker connection the delivery came on: an ack on a newer connection would be meaningless.
    let generation: Int
    let targets: DeviceTargets
    /// Notifications of the whole job: its targets, or for a job resolved in pieces (`JobAssembly`), all its parts'.
    private(set) var notificationCount: Int
    private(set) var remaining: Int
    private(set) var delivered = 0
    /// Not handed to APNs by the job's deadline: not sent.
    private(set) var expired = 0

    /// Answers of this attempt that judge a token (200, 410, 400 mismatch: `MassInvalidationGuard.judgesToken`).
    private(set) var judged = 0

    /// What few jobs have, in one box made with the first of it: a job of deliveries alone (most jobs) then makes and
    /// frees no arrays for it, and its progress stays within the 120 bytes that glibc keeps in its fast bins
    /// (`AllocationSizeTests` holds it).
    /// Finished jobs are freed by the hundred, more than glibc's per-thread cache holds, and above that size the
    /// rest went through malloc's slow path (bins sorted and merged), again when the next jobs were made.
    private final class Rare {
        var assembly: JobAssembly?
        var dead: [(target: DeviceTarget, response: APNsResponse)] = []
        var failed: [(target: DeviceTarget, reason: String)] = []
        var retryable: [(target: DeviceTarget, reason: String, label: String, delay: Double)] = []
        var heldBack: [(target: DeviceTarget, response: APNsResponse)] = []
        var unrecordedFinal: [SettledOutcome] = []
        /// Some notifications were not sent because no credential serves the job's topic now: the job is parked.
        var unserved = false
        /// Not sent: the job was cancelled (`apns-worker jobs cancel`); users never resolved count one each.
        var cancelled = 0
        /// What earlier deliveries of the job settled (a redelivered job), for its summary.
        var earlier = EarlierOutcomes()
        /// A job with a `local_window`: how it was cut by its users' hours.
        var window: WindowState?
        /// A large job followed as it runs (`followAnswers`): set on the broker thread before the job is queued.
        var answersSoFar: AnswersSoFar?
    }

    /// The answers of a large job so far, counted where they are recorded (its lane's sender thread) and read on
    /// the broker thread while the job runs, so that `apns-worker jobs show` sees them before the job ends.
    final class AnswersSoFar: Sendable {
        let delivered = Atomic<Int>(0)
        let dead = Atomic<Int>(0)
        let failed = Atomic<Int>(0)
    }

    /// Broker thread, before the job is queued: from now on its answers are also counted where the broker thread can
    /// read them as they come.
    func followAnswers() -> AnswersSoFar {
        let counts = AnswersSoFar()
        madeRare.answersSoFar = counts
        return counts
    }

    /// A windowed job's users and tokens: those that wait for their hours (published as parts when the job settles),
    /// how many the job named as it arrived, and whether it is itself a part that waited.
    struct WindowState {
        var parts: [WindowSplit.Part]
        var named: Int
        var isPart: Bool
        /// Users and tokens whose window opens only after the job's deadline.
        var expired: Int

        var waiting: Int { parts.reduce(0) { $0 + $1.users.count + $1.tokens.count } }
    }
    private var rare: Rare?
    private var madeRare: Rare {
        if let rare { return rare }
        let made = Rare()
        rare = made
        return made
    }

    /// Broker thread only: for one piece of a large job, the job it belongs to.
    var assembly: JobAssembly? {
        get { rare?.assembly }
        set { madeRare.assembly = newValue }
    }
    var dead: [(target: DeviceTarget, response: APNsResponse)] { rare?.dead ?? [] }
    var failed: [(target: DeviceTarget, reason: String)] { rare?.failed ?? [] }
    /// APNs asked to try these again later (throttling, server trouble, no answer), with its suggested delay.
    /// `reason` goes to the parked job's headers; `label` is its bounded form for /metrics (Apple's reason,
    /// `no_answer`, `other`).
    var retryable: [(target: DeviceTarget, reason: String, label: String, delay: Double)] { rare?.retryable ?? [] }
    /// 400 mismatch answers the mass-invalidation guard held back: no token removed, no event (see `applyGuard`).
    var heldBack: [(target: DeviceTarget, response: APNsResponse)] { rare?.heldBack ?? [] }

    /// The newest outcome that became final since the last hand-over to the idempotency record (`SentRecord`
    /// members: the token, or for a dead token what its event needs); older ones wait in `Rare.unrecordedFinal`. A
    /// job of one notification (most jobs are) then needs no array, and its outcome is only ever read if the job
    /// cannot be settled at once.
    private var newestUnrecorded: SettledOutcome?
    var hasUnrecordedFinal: Bool { newestUnrecorded != nil }
    /// Loop thread only: waiting in the worker's list of jobs with outcomes to hand over; handed back to the broker
    /// thread as complete (from then on the broker thread owns the job).
    var awaitsHandOver = false
    var handedBack = false

    /// Whether the job's id names it across redeliveries (an id of its own or an AMQP message-id), so that a
    /// record of what was already sent can be kept for it.
    let hasStableID: Bool

    convenience init(job: PushJob, delivery: JobDelivery, generation: Int, targets: [DeviceTarget], hasStableID: Bool) {
        self.init(
            job: job, delivery: delivery, generation: generation, targets: DeviceTargets(targets),
            hasStableID: hasStableID)
    }

    init(job: PushJob, delivery: JobDelivery, generation: Int, targets: DeviceTargets, hasStableID: Bool) {
        self.hasStableID = hasStableID
        self.job = job
        self.delivery = delivery
        self.generation = generation
        self.targets = targets
        self.notificationCount = targets.count
        self.remaining = targets.count
    }

    var isComplete: Bool { remaining == 0 }

    /// One piece of this (large) job: these targets, with nothing of the job's own outcomes.
    func piece(_ targets: [DeviceTarget]) -> JobProgress {
        JobProgress(job: job, delivery: delivery, generation: generation, targets: targets, hasStableID: hasStableID)
    }

    /// The notification to target `index`. A target's token was checked where it came in (the job's decoding, the
    /// cache's or a retry's reading), so the notification says so and the sender does not scan it again. The
    /// target's fields are read where `targets` holds them: a copy of the target would count its token and user
    /// once more.
    func notification(_ index: Int) -> APNsNotification {
        APNsNotification(
            deviceToken: targets[index].token, environment: targets[index].environment, message: job.message,
            deviceTokenChecked: true)
    }

    /// The same, `sibling` (one this job already made) lending it its message: the two share every field but the
    /// token and environment (`APNsNotification.sending(to:environment:)`).
    func notification(_ index: Int, sharingWith sibling: borrowing APNsNotification) -> APNsNotification {
        sibling.sending(to: targets[index].token, environment: targets[index].environment, deviceTokenChecked: true)
    }

    func recordDelivered(_ index: Int) {
        delivered += 1
        remaining -= 1
        rare?.answersSoFar?.delivered.add(1, ordering: .relaxed)
        if hasStableID { noteFinal(.done(targets[index].token)) }
    }

    func countAnswer(_ response: APNsResponse) {
        if MassInvalidationGuard.judgesToken(response) { countJudgement() }
    }

    /// An answer that judged a token (a 200 does).
    func countJudgement() { judged += 1 }

    func recordDead(_ index: Int, _ response: APNsResponse) {
        madeRare.dead.append((targets[index], response))
        remaining -= 1
        rare?.answersSoFar?.dead.add(1, ordering: .relaxed)
        if hasStableID { noteFinal(.dead(targets[index], response)) }
    }

    func recordFailed(_ index: Int, reason: String) {
        madeRare.failed.append((targets[index], reason))
        remaining -= 1
        rare?.answersSoFar?.failed.add(1, ordering: .relaxed)
        if hasStableID { noteFinal(.failed(targets[index].token, reason: reason)) }
    }

    /// The outcome is moved in, and the newest before it moved on, never copied (each copy counted its strings).
    private func noteFinal(_ outcome: consuming SettledOutcome) {
        if let newestUnrecorded = newestUnrecorded.take() {
            // Room at once for what the array takes until the next hand-over: this outcome, one for each still to
            // come, and the newest, which `takeUnrecordedFinal` appends. Grown by doubling, the array was copied
            // eight times over a job of a hundred notifications. Capped: a bulk job's outcomes are handed over every
            // few milliseconds, a few at a time, and each hand-over starts a new array.
            let made = madeRare
            if made.unrecordedFinal.capacity == 0 {
                made.unrecordedFinal.reserveCapacity(min(remaining + 2, Self.outcomesReservedAtOnce))
            }
            made.unrecordedFinal.append(newestUnrecorded)
        }
        newestUnrecorded = outcome
    }

    /// The most outcomes room is made for at once (a bulk job's can number 100,000).
    private static let outcomesReservedAtOnce = 128

    /// Hands over the outcomes finished since the last call, if any, in the order they became final.
    func takeUnrecordedFinal() -> [SettledOutcome]? {
        guard let newest = newestUnrecorded else { return nil }
        var taken = rare?.unrecordedFinal ?? []
        rare?.unrecordedFinal = []
        newestUnrecorded = nil
        taken.append(newest)
        return taken
    }

    /// Broker thread: the job's summary went out (in an earlier try of its publications, or an earlier delivery).
    var summarySent = false

    /// A redelivered job: what the idempotency record says an earlier delivery already settled. Those answers
    /// count for the guard and in the summary, and the dead tokens among them are published again (their events may
    /// not have been).
    func restore(_ settled: Settled) {
        judged += settled.tokens.count
        if !settled.dead.isEmpty { madeRare.dead += settled.dead }
        // A retry's record also holds its first attempt's outcomes, which its summary does not cover.
        if job.retryTargets == nil && settled.earlier != EarlierOutcomes() { madeRare.earlier = settled.earlier }
        summarySent = settled.summarySent
    }

    func recordRetryable(_ index: Int, reason: String, label: String, delay: Double) {
        madeRare.retryable.append((targets[index], reason, label, delay))
        remaining -= 1
    }

    /// Not sent: no credential serves the job's topic now (a reload took it away). Kept with the retryable ones, to
    /// be parked with them: not final, a redelivery sends it if a credential serves the topic by then.
    func recordUnserved(_ index: Int, reason: String) {
        madeRare.retryable.append((targets[index], reason, Self.unservedLabel, 0))
        madeRare.unserved = true
        remaining -= 1
    }

    /// Whether the job must be parked whatever its attempts: some of its notifications have no credential to go with.
    var isUnserved: Bool { rare?.unserved ?? false }
    /// The label of those among `retryable`.
    static let unservedLabel = "unserved"

    /// The deadline passed before this notification could be handed to APNs. Final: a redelivery does not send it.
    func recordExpired(_ index: Int) {
        expired += 1
        remaining -= 1
        if hasStableID { noteFinal(.expired(targets[index].token)) }
    }

    /// Not sent: the job was cancelled before this notification was handed to APNs. Not final in the idempotency
    /// record: a copy of the job that comes back is cancelled again by the fleet's record of cancellations.
    func recordCancelled(_ index: Int) {
        madeRare.cancelled += 1
        remaining -= 1
    }

    /// Broker thread, on the whole job of a large one cancelled before these users were resolved: they count as
    /// cancelled, one notification each (their tokens were never read).
    func cancelUnresolved(users count: Int) {
        notificationCount += count
        madeRare.cancelled += count
    }

    /// Notifications the job's cancellation kept from being sent.
    var cancelled: Int { rare?.cancelled ?? 0 }

    /// Broker thread, as a windowed job starts: its users outside their hours wait in parts; those whose window opens
    /// only after the job's deadline count as expired, one each (their tokens are never read). `isPart`: the delivery
    /// is a part that waited.
    func cutByWindow(_ split: WindowSplit, isPart: Bool) {
        madeRare.window = WindowState(parts: split.parts, named: split.named, isPart: isPart, expired: split.expired)
        notificationCount += split.expired
    }

    var window: WindowState? { rare?.window }

    /// Broker thread, on a windowed job cancelled before it settled: what waits for its hours is cancelled instead,
    /// one each. Returns how many.
    func cancelWaitingParts() -> Int {
        guard let waiting = rare?.window?.waiting, waiting > 0 else { return 0 }
        rare?.window?.parts = []
        cancelUnresolved(users: waiting)
        return waiting
    }

    /// Broker thread, on the whole job of a large one: a piece's outcomes, once every one of them is in. The piece's
    /// targets are not kept: memory follows what went wrong, not the job's size.
    func absorb(_ piece: JobProgress) {
        notificationCount += piece.notificationCount
        delivered += piece.delivered
        if let pieceRare = piece.rare {
            madeRare.dead += pieceRare.dead
            madeRare.failed += pieceRare.failed
            madeRare.retryable += pieceRare.retryable
            if pieceRare.unserved { madeRare.unserved = true }
            if pieceRare.cancelled > 0 { madeRare.cancelled += pieceRare.cancelled }
        }
        expired += piece.expired
        judged += piece.judged
        for outcome in piece.takeUnrecordedFinal() ?? [] { noteFinal(outcome) }
    }

    /// Once complete, when a retry could only come after the job's deadline (`RetryPolicy.Decision.expire`): the
    /// retryable notifications expire now instead of travelling through a delay queue. Returns how many expired.
    func expireRetryable() -> Int {
        let count = retryable.count
        expired += count
        rare?.retryable.removeAll()
        return count
    }

    /// Whether the guard judged this job: a job whose publishes are made again is judged once.
    private(set) var guardApplied = false
    /// Who held its mismatches back, if anyone did.
    private(set) var heldBackBy: MassInvalidationGuard.Verdict = .remove

    /// What this job's answers say for the guard.
    var invalidationCounts: InvalidationCounts {
        InvalidationCounts(mismatches: dead.filter { APNsOutcome.isTokenMismatch($0.response) }.count, judged: judged)
    }

    /// Once every outcome is in, the guard's verdict: held back, the 400 mismatch answers move out of `dead` into
    /// `heldBack` (no removal, no event). Returns how many it held back.
    func applyGuard(_ verdict: MassInvalidationGuard.Verdict) -> Int {
        guardApplied = true
        heldBackBy = verdict
        guard verdict != .remove else { return 0 }
        guard let rare else { return 0 }
        rare.heldBack = rare.dead.filter { APNsOutcome.isTokenMismatch($0.response) }
        rare.dead.removeAll { APNsOutcome.isTokenMismatch($0.response) }
        return heldBack.count
    }

    /// Why the guard held answers back, in words for the job's summary and the log.
    var heldBackExplanation: String? {
        guard !heldBack.isEmpty else { return nil }
        var reasons: [String: Int] = [:]
        for held in heldBack { reasons[held.response.reason?.rawValue ?? "", default: 0] += 1 }
        let counts = reasons.keys.sorted().map { "\(reasons[$0]!) \($0)" }.joined(separator: ", ")
        let environments = Set(heldBack.map(\.target.environment.rawValue)).sorted().joined(separator: ", ")
        let seen =
            heldBackBy == .heldBackByFleet
            ? "the fleet's recent answers are mostly 400 too, and this job's \(heldBack.count) 400s (\(counts)) are held back"
            : "\(heldBack.count) of the \(judged) answers that judge a token were 400 (\(counts))"
        return seen
            + ": most likely a wrong topic (\(job.topic)) or APNs endpoint for \(environments), not dead tokens; "
            + "no token removed, no dead-token event published"
    }

    /// The summary a job's sender can ask for (reply_to), as JSON: the notifications of every delivery of the job
    /// (what earlier deliveries settled, as the idempotency record keeps it, and this one's). `retrying`: the
    /// retryable ones were scheduled for another attempt (then this summary covers this attempt only), else they
    /// count as failed.
    func summaryJSON(retrying: Bool) -> [UInt8] {
        let earlier = rare?.earlier ?? EarlierOutcomes()
        var summary = JobSummary(jobID: job.id, attempt: job.attempt)
        summary.failedByReason = earlier.failedByReason
        for failure in failed { summary.failedByReason[failure.reason, default: 0] += 1 }
        if !retrying {
            for failure in retryable { summary.failedByReason["undelivered: " + failure.reason, default: 0] += 1 }
        }
        summary.notifications = notificationCount + earlier.count
        summary.delivered = delivered + earlier.delivered
        summary.dead = dead.count
        summary.failed = failed.count + earlier.failed + (retrying ? 0 : retryable.count)
        summary.retrying = retrying ? retryable.count : 0
        summary.heldBack = heldBack.count
        summary.expired = expired + earlier.expired + (rare?.window?.expired ?? 0)
        summary.cancelled = cancelled
        summary.heldBackReason = heldBackExplanation
        if job.localWindow != nil { summary.waitingForWindow = rare?.window?.waiting ?? 0 }
        return summary.json
    }
}

/// A value one thread alone reads and writes (a lane's sender thread), kept in a Sendable owner: the
/// confinement is the invariant, not a lock. Debug builds check it, as swift-nio's `NIOLoopBound` asks its event
/// loop: every touch asks `isOnItsThread`, and a touch from anywhere else stops the process.
final class LoopConfined<Value>: @unchecked Sendable {
    private var confined: Value
    #if DEBUG
        private let isOnItsThread: @Sendable () -> Bool
    #endif

    /// `isOnItsThread`: whether the caller runs on the thread (or serial queue) the value belongs to.
    init(_ value: Value, isOnItsThread: @escaping @Sendable () -> Bool) {
        confined = value
        #if DEBUG
            self.isOnItsThread = isOnItsThread
        #endif
    }

    var value: Value {
        get {
            checkThread()
            return confined
        }
        _modify {
            checkThread()
            yield &confined
        }
    }

    @inline(__always)
    private func checkThread() {
        #if DEBUG
            precondition(isOnItsThread(), "LoopConfined<\(Value.self)> used off the thread that owns it")
        #endif
    }
}
