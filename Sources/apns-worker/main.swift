import Configuration
import Foundation
import Telemetry

// apns-worker: one executable, one subcommand per job. Each subcommand lives in its own file as a function
// `<name>Command(arguments)`; the work itself is in the WorkerPipeline and Operations modules.

let overview = """
    apns-worker: delivers push notifications to Apple's APNs. Workers consume jobs from RabbitMQ, resolve users to
    device tokens in Redis, send over persistent HTTP/2 connections, and publish dead tokens for cleanup.

    USAGE: apns-worker <command> [options]          (no command: run)

    COMMANDS:
      run                 run a worker (the default); scale by running more of them
      enqueue             publish jobs: from a JSON Lines file, stdin, or flags (--user, --alert, ...)
      tokens              the token cache: tokens add | remove | list | keys | import | migrate
      dead-tokens tail    watch dead-token events as workers publish them
      channels            broadcast channels of an app (iOS 18 Live Activities): create | list | show | delete
      jobs                jobs already enqueued: show (progress, ETA) | list | cancel (fleet-wide, within a second)
      stats               queue depths, fleet-wide rates and live workers, from the broker and Redis
      cleanup             apply dead-token and registration events to the cache; sweep inactive tokens

    Every command takes:
      --config FILE       settings as KEY=VALUE lines (# comments; config/apns-worker.env lists every key)
      --set KEY=VALUE     one setting, repeatable. Flags win over the environment, which wins over the file.
      --log-level LEVEL   trace, debug, info, notice, warning, error
      --help              what the command does, its options and an example

    The settings most deployments need (all are environment variables; each command's --help lists those it reads):
    \(SettingTable.help(listing: SettingTable.essentials))

    A job (one JSON message on PUSH_JOBS_QUEUE, default push.jobs, the urgent lane; campaigns go to
    PUSH_BULK_QUEUE, default push.bulk, the bulk lane, served after urgent work):
      {"id": "job-42", "users": ["u1"], "push_type": "alert", "payload": {"aps": {"alert": "Hello"}}}

    EXAMPLES:
      APNS_KEY_FILE=AuthKey.p8 APNS_KEY_ID=ABC123DEFG APNS_TEAM_ID=DEF123GHIJ APNS_TOPIC=com.example.app apns-worker
      apns-worker tokens add alice 3f0c...e1 --environment sandbox
      apns-worker enqueue --user alice --alert "Your order shipped"
      apns-worker enqueue --bulk campaign.jsonl
      apns-worker stats

    EXIT CODES:
      0   done (run and cleanup: stopped on a signal after finishing their work)
      1   a second signal cut the drain short; unfinished jobs return to the queue
      2   bad command line
      65  some input was refused (enqueue: the jobs named on stderr were not published)
      69  the broker or Redis could not be reached
      78  bad configuration (the message names the key)
    """

var arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "--help" || arguments.first == "-h" {
    print(overview)
    exit(ExitCode.success)
}
let command = arguments.first.flatMap { $0.hasPrefix("-") ? nil : $0 } ?? "run"
if arguments.first == command { arguments.removeFirst() }
// The long-running commands take SIGINT, SIGTERM and SIGHUP with sigwait; they are blocked before any thread starts.
if command == "run" || command == "cleanup" { ServiceRunner.blockServiceSignals() }
switch command {
case "run": runCommand(arguments)
case "enqueue": enqueueCommand(arguments)
case "tokens": tokensCommand(arguments)
case "dead-tokens": deadTokensCommand(arguments)
case "stats": statsCommand(arguments)
case "jobs": jobsCommand(arguments)
case "cleanup": cleanupCommand(arguments)
case "channels": channelsCommand(arguments)
case "help":
    print(overview)
default:
    fail("unknown command \(command); try 'apns-worker --help'", code: ExitCode.usage)
}
exit(ExitCode.success)
