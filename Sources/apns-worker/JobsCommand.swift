import Configuration
import Foundation
import Redis
import RedisStore
import Telemetry
import WorkerPipeline

let jobsHelp = """
    apns-worker jobs: act on jobs already enqueued, fleet-wide, through Redis (no worker is asked).

    USAGE: apns-worker jobs show JOB_ID [--json]
           apns-worker jobs list [--json]
           apns-worker jobs cancel JOB_ID [--reason TEXT] [--json]

      show      a job's state (unknown, scheduled, running, done, cancelled), its counts (resolved, sent, delivered, dead,
                failed, retrying, held back, expired, cancelled), its rate and, while it runs, the time left. Workers
                add to a job's progress about once a second (apns:job:<id>:progress, kept 24 hours after its last
                update) for jobs with an id and at least \(JobProgressDelta.minimumTargets) users and tokens, and
                for every job with an id that waits for its send_at or its users' local_window; any other job shows
                as unknown (its summary, on its reply_to queue, says how it went). --json: one object
                (schema/job-progress.schema.json).
      list      the jobs running now (progress updated in the last minute), those waiting for their send_at and
                those with users waiting for their local_window, as show prints them; --json: an array.

      cancel    records that JOB_ID (the job's "id", or its AMQP message-id) is cancelled, kept 7 days in Redis
                (apns:cancelled:<job id>). Every worker running the job stops sending it within a second: what it
                has not handed to APNs is not sent, and the job settles as usual (acknowledged, never parked), its
                summary counting those notifications as "cancelled" (and users not yet resolved, one each). A copy
                of the job that comes back later (a retry, a redelivery) sends nothing; a job cancelled before any
                worker takes it sends nothing; a job that had finished stays done. Cancelling again changes nothing
                (the first reason is kept).
                --reason TEXT is kept with the cancellation. Jobs without an id cannot be cancelled. Prints what
                show knows of the job (--json: that object alone, the confirmation on standard error).

    Settings it reads (environment, --config file or --set): the Redis ones,
    \(SettingTable.help(listing: SettingTable.redisSettings))

    EXAMPLES:
      apns-worker jobs list
      apns-worker jobs show campaign-2026-12 --json
      apns-worker jobs cancel campaign-2026-12 --reason "wrong text"

    EXIT CODES: 0 done, 2 bad command line, 69 Redis unreachable, 78 bad configuration.
    """

func jobsCommand(_ arguments: [String]) {
    let parsed = ParsedArguments.parse(
        arguments, command: "jobs", valued: ["--reason"], switches: ["--json"],
        help: jobsHelp)
    guard let action = parsed.positionals.first else {
        fail("jobs: say show, list or cancel; try 'apns-worker jobs --help'", code: ExitCode.usage)
    }
    guard ["show", "list", "cancel"].contains(action) else {
        fail("jobs: unknown action \(action) (show, list, cancel)", code: ExitCode.usage)
    }
    let operands = Array(parsed.positionals.dropFirst())
    let json = parsed.switches.contains("--json")
    if action == "list" {
        guard operands.isEmpty else { fail("jobs list: takes no JOB_ID", code: ExitCode.usage) }
    } else {
        // Any id a job can carry: a job's id has no length limit, and an empty one is no id.
        guard operands.count == 1 else {
            fail(
                "jobs \(action): wants one JOB_ID, got \(operands.count); try 'apns-worker jobs --help'",
                code: ExitCode.usage)
        }
        guard !operands[0].isEmpty else {
            fail("jobs \(action): JOB_ID is empty (an empty id names no job)", code: ExitCode.usage)
        }
    }
    if action != "cancel", parsed.value("--reason") != nil {
        fail("jobs \(action): --reason goes with cancel", code: ExitCode.usage)
    }
    let reason = parsed.value("--reason")
    if let reason, reason.utf8.count > 1024 {
        fail("jobs cancel: --reason must be at most 1,024 bytes", code: ExitCode.usage)
    }
    let configuration = parsed.configuration(requiringCredentials: false)
    do {
        let redis = try configuration.redis.connect()
        let progress = SharedJobProgress(redis: redis)
        switch action {
        case "list":
            // A windowed job runs while some of its parts wait: it is in both lists, and listed once. Of the
            // scheduled list, what still waits: a job for its send_at, a windowed job's parts for users' hours (it
            // stays on the list until its last part's hours opened, done or not).
            let running = try progress.running()
            var seen = Set(running)
            let waiting = try progress.scheduled().filter { seen.insert($0).inserted }
            let reports =
                try running.map { id throws(RedisError) in try progress.read(id) }
                + waiting.map { id throws(RedisError) in try progress.read(id) }.filter {
                    $0.state == .scheduled || ($0.counts["waiting_for_window"] ?? 0) > 0
                }
            if json {
                print("[" + reports.map(\.json).joined(separator: ",") + "]")
            } else {
                print(
                    reports.isEmpty
                        ? "no job running (with an id and at least \(JobProgressDelta.minimumTargets) users and "
                            + "tokens) or scheduled"
                        : reports.map(\.text).joined(separator: "\n"))
            }
        case "show":
            let report = try progress.read(operands[0])
            print(json ? report.json : report.text)
        default:
            try cancelJob(operands[0], reason: reason, redis: redis, progress: progress, json: json)
        }
    } catch {
        failReaching("jobs \(action)", error)
    }
}

/// `jobs cancel`: records the cancellation for the fleet, then says so with the job's progress. With --json, standard
/// output is the one object `show --json` prints; the confirmation goes to standard error.
private func cancelJob(
    _ jobID: String, reason: String?, redis: any RedisClient, progress: SharedJobProgress, json: Bool
) throws {
    let cancellations = SharedCancellations(redis: redis)
    // Anything recorded of the job (its progress, its send_at), cancelled or not.
    let before = try progress.read(jobID)
    let knownBefore = before.updatedAt != nil || before.scheduledFor != nil
    try cancellations.cancel(jobID, reason: reason)
    let recorded = try cancellations.cancellation(of: jobID)
    let at = recorded.map { Date(timeIntervalSince1970: $0.at).formatted(.iso8601) } ?? "now"
    var line = "job \(jobID) cancelled at \(at)"
    if let kept = recorded?.reason { line += " (\(kept))" }
    let report = try progress.read(jobID)
    var confirmation =
        line + ": workers send nothing more of it within a second; its summary counts the rest as cancelled"
    if before.state == .done {
        confirmation =
            line + ": the job had finished; nothing of it is sent again, and a job given this id within 7 days sends "
            + "nothing"
    } else if !knownBefore {
        // A typo looks like any other id: say that nothing is known of this one, and what the cancel still does.
        confirmation +=
            "\nno progress is recorded for this id (a job not started yet, one of few users, one that ended a day ago, "
            + "or a mistyped id): a job with it that comes within 7 days sends nothing"
    }
    if json {
        FileHandle.standardError.write(Data((confirmation + "\n").utf8))
        print(report.json)
    } else {
        print(confirmation + "\n" + report.text)
    }
}
