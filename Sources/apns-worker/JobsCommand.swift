import Configuration
import Foundation
import Redis
import RedisStore
import Telemetry

let jobsHelp = """
apns-worker jobs: act on jobs already enqueued, fleet-wide, through Redis (no worker is asked).

USAGE: apns-worker jobs cancel JOB_ID [--reason TEXT]

  cancel    records that JOB_ID (the job's "id", or its AMQP message-id) is cancelled, kept 7 days in Redis
            (apns:cancelled:<job id>). Every worker running the job stops sending it within a second: what it
            has not handed to APNs is not sent, and the job settles as usual (acknowledged, never parked), its
            summary counting those notifications as "cancelled" (and users not yet resolved, one each). A copy
            of the job that comes back later (a retry, a redelivery) sends nothing; a job cancelled before any
            worker takes it sends nothing. Cancelling again changes nothing (the first reason is kept).
            --reason TEXT is kept with the cancellation. Jobs without an id cannot be cancelled.

Settings it reads (environment, --config file or --set): the Redis ones,
\(SettingTable.help(listing: SettingTable.redisSettings))

EXAMPLES:
  apns-worker jobs cancel campaign-2026-12 --reason "wrong text"

EXIT CODES: 0 done, 2 bad command line, 69 Redis unreachable, 78 bad configuration.
"""

func jobsCommand(_ arguments: [String]) {
    let parsed = ParsedArguments.parse(arguments, command: "jobs", valued: ["--reason"], switches: [], help: jobsHelp)
    guard let action = parsed.positionals.first else {
        fail("jobs: say cancel; try 'apns-worker jobs --help'", code: ExitCode.usage)
    }
    guard action == "cancel" else { fail("jobs: unknown action \(action) (cancel)", code: ExitCode.usage) }
    let operands = parsed.positionals.dropFirst()
    guard operands.count == 1, let jobID = operands.first else {
        fail("jobs cancel: wants one JOB_ID; try 'apns-worker jobs --help'", code: ExitCode.usage)
    }
    guard !jobID.isEmpty, jobID.utf8.count <= 256 else {
        fail("jobs cancel: JOB_ID must be 1 to 256 bytes", code: ExitCode.usage)
    }
    let reason = parsed.value("--reason")
    if let reason, reason.utf8.count > 1024 { fail("jobs cancel: --reason must be at most 1,024 bytes", code: ExitCode.usage) }
    let configuration = parsed.configuration(requiringCredentials: false)
    do {
        let cancellations = SharedCancellations(redis: try configuration.redis.connect())
        try cancellations.cancel(jobID, reason: reason)
        let recorded = try cancellations.cancellation(of: jobID)
        let at = recorded.map { Date(timeIntervalSince1970: $0.at).formatted(.iso8601) } ?? "now"
        var line = "job \(jobID) cancelled at \(at)"
        if let kept = recorded?.reason { line += " (\(kept))" }
        print(line + ": workers send nothing more of it within a second; its summary counts the rest as cancelled")
    } catch {
        failReaching("jobs cancel", error)
    }
}
