import APNsModel
import Foundation

/// A job with more users than one piece (`WorkerCore.Settings.usersPerPiece`): its users are resolved and sent a
/// piece at a time, so that a 100,000-user campaign costs the broker thread no more at a time than a small job, urgent
/// deliveries are read and started while its pieces are resolved (on the session's `JobPreparer` thread), and the memory it holds follows the piece (plus 8 bytes a
/// notification to send each token once, and what went wrong), not the job. Broker thread only.
///
/// Each piece is a `JobProgress` of its own on its way to APNs; when one comes back complete, `whole` absorbs its
/// outcomes. Once every user is resolved and no piece is out, `whole` is settled like any finished job. Users whose
/// Redis node did not answer (a cluster master lost) are deferred: asked for again, a piece at a time, once their
/// pause has passed, while the other users' pieces go on.
final class JobAssembly {
    /// The job's outcomes so far, settled once complete.
    let whole: JobProgress
    /// The next user to resolve.
    private var nextUser = 0
    private(set) var piecesOut = 0
    /// A piece's users are being resolved (by the session's `JobPreparer`).
    var resolving = false
    /// What an earlier delivery of the job settled: skipped in every piece.
    let alreadySettled: Set<String>
    /// Hashes of the tokens reached so far (Swift's hasher is seeded per process, which is all this needs).
    private var seen = Set<Int>()
    /// Users whose node did not answer, asked for again from `deferredUntil` on.
    private var deferred: [String] = []
    private(set) var deferredUntil = Date.distantPast
    /// The job's own tokens (`tokens`) went with a piece already.
    private var ownTokensTaken = false

    init(whole: JobProgress, alreadySettled: Set<String>) {
        self.whole = whole
        self.alreadySettled = alreadySettled
    }

    var job: PushJob { whole.job }
    var lane: JobLane { whole.delivery.lane }
    var hasUsersLeft: Bool { nextUser < job.users.count || !deferred.isEmpty }
    var isComplete: Bool { !hasUsersLeft && !resolving && piecesOut == 0 }

    /// Whether a piece can be resolved at `now`: users never asked for, or deferred users whose pause has passed.
    func hasUsersReady(at now: Date) -> Bool {
        nextUser < job.users.count || (!deferred.isEmpty && now >= deferredUntil)
    }

    /// When deferred users may be asked for again, if some wait.
    var deferredDue: Date? { deferred.isEmpty ? nil : deferredUntil }

    /// The users of the next piece, at most `size`; they count as taken. Deferred users come after the others.
    func takeUsers(_ size: Int, now: Date = Date()) -> ArraySlice<String> {
        if nextUser < job.users.count {
            let users = job.users[nextUser..<min(job.users.count, nextUser + size)]
            nextUser = users.endIndex
            return users
        }
        guard now >= deferredUntil else { return [] }
        let users = deferred.prefix(size)
        deferred.removeFirst(users.count)
        return users
    }

    /// These users' node did not answer: they are asked for again from `until` on.
    func deferUsers(_ users: [String], until: Date) {
        deferred += users
        deferredUntil = until
    }

    /// The job was cancelled: the users not resolved yet (deferred ones included) are dropped; returns how many
    /// count as cancelled, one each, less the tokens an earlier delivery settled that no piece of this one reached:
    /// those belong to users left, and the job's summary counts them already (most users have one device).
    func dropUsersLeft() -> Int {
        let count = job.users.count - nextUser + deferred.count
        nextUser = job.users.count
        deferred.removeAll()
        let settledElsewhere = alreadySettled.reduce(0) { seen.contains($1.hashValue) ? $0 : $0 + 1 }
        return max(0, count - settledElsewhere)
    }

    /// Whether the job's own tokens go with this piece: with the first piece that reaches anyone, once.
    func takeOwnTokens() -> Bool {
        defer { ownTokensTaken = true }
        return !ownTokensTaken
    }

    /// Whether a token is reached for the first time in this job.
    func firstTime(_ token: String) -> Bool { seen.insert(token.hashValue).inserted }

    func sent(_ piece: JobProgress) {
        piece.assembly = self
        piecesOut += 1
    }

    /// A piece came back complete.
    func absorb(_ piece: JobProgress) {
        whole.absorb(piece)
        piecesOut -= 1
    }
}
