import APNsModel
import Foundation
import Telemetry

/// Operators' hold on jobs under way. Cancelled jobs (`apns-worker jobs cancel`): what they have not sent yet is not
/// sent, and they settle as usual, their summary counting it as cancelled.
extension SessionLoop {
    /// Whether jobs are under way here, so that cancellations are worth reading.
    private var hasWorkUnderWay: Bool { core.jobsInFlight > 0 || backlogs.counts.total > 0 }

    /// When the loop must wake up to read cancellations again, if work is under way.
    var cancellationsDue: Date? {
        guard session.cancellations != nil, hasWorkUnderWay else { return nil }
        return cancellations.nextRead
    }

    /// Reads the fleet's cancellations when due: every `CancellationWatch.interval` while jobs are under way or
    /// arriving (so that a job cancelled before it came is known before it starts), and once at the start. The jobs
    /// newly cancelled lose what they have not sent.
    func readCancellations(at now: Date, jobsArriving: Bool = false) throws {
        guard let source = session.cancellations, cancellations.isDue(at: now),
            jobsArriving || hasWorkUnderWay || cancellations.nextRead == .distantPast
        else { return }
        let (fresh, refused) = try cancellations.refresh(from: source, now: now)
        if let refused {
            statistics.countDataError("cancellations")
            logger.error("Redis refused the read of cancelled jobs; asking again shortly", ["redis.error": refused])
        }
        guard !fresh.isEmpty else { return }
        var dropped = 0
        let held = rateGroupHolds.remove(jobsIn: fresh)
        for lane in JobLane.allCases {
            let removed = backlogs.withQueue(lane) { $0.remove(jobsIn: fresh) } + (held[lane] ?? [])
            dropped += removed.count
            worker.answers.settleCancelled(removed, lane: lane)
        }
        var unresolved = 0
        for assembly in assemblies where CancellationWatch.names(assembly.whole, among: fresh) {
            unresolved += try cancelUsersLeft(of: assembly)
        }
        if dropped + unresolved > 0 {
            logger.info(
                "jobs cancelled: what they had not sent is not sent",
                [
                    "jobs": String(fresh.count), "notifications.cancelled": String(dropped),
                    "users.cancelled": String(unresolved), "job.id": fresh.sorted().prefix(5).joined(separator: ",")
                ])
        }
    }

    /// A large job cancelled while users were left to resolve: they count as cancelled, one notification each, and
    /// the job settles once nothing of it is out. Returns how many users were dropped.
    func cancelUsersLeft(of assembly: JobAssembly) throws -> Int {
        let users = assembly.dropUsersLeft()
        guard users > 0 else { return 0 }
        assembly.whole.cancelUnresolved(users: users)
        progressTracker.cancelled(assembly.whole, users: users)
        statistics.cancelled.add(users, ordering: .relaxed)
        // A piece being resolved comes back through `takePrepared`, which settles the job after it.
        if !assembly.resolving {
            assemblies.removeAll { $0 === assembly }
            if assembly.isComplete { core.handle(.jobsSettled(try finish([assembly.whole]))) }
        }
        return users
    }
}

/// Large jobs' progress, reported to the fleet's record about once a second (`apns-worker jobs show`).
extension SessionLoop {
    func reportProgress(at now: Date) throws {
        guard progressTracker.isDue(at: now) else { return }
        let deltas = progressTracker.take(at: now)
        // A store without the record (a test's): the counts have nowhere to go.
        guard let record = session.progress, !deltas.isEmpty else { return }
        switch try record.add(deltas) {
        case .answered:
            break
        case .unavailable:
            progressTracker.putBack(deltas)
        case .refused(let message):
            // A key of the wrong type: these counts are lost, the job itself goes on.
            statistics.countDataError("job_progress")
            logger.warning("Redis refused a job's progress", ["redis.error": message])
        }
    }
}
