import Configuration
import Foundation
import Operations
import Telemetry

let enqueueHelp = """
    apns-worker enqueue: publish push jobs onto PUSH_JOBS_QUEUE (the urgent lane), or with --bulk onto
    PUSH_BULK_QUEUE (the bulk lane).

    USAGE: apns-worker enqueue FILE            jobs from a file: one JSON job per line (JSON Lines), or one job
           apns-worker enqueue -               the same from stdin
           apns-worker enqueue --user U --alert TEXT [options]
                                               one job from flags
           apns-worker enqueue --check FILE    check the jobs only: what a worker would refuse, nothing published

    Each job is checked as a worker would check it; a bad one is reported with its line number and not published,
    the others are. Jobs are published persistent, with publisher confirms (nothing is reported published that the
    broker did not take), and get a message-id when they have no "id", so a redelivered job is recognised. A large
    file shows a progress bar on a terminal, and a progress line every 5 s otherwise. With a cluster's nodes in
    AMQP_URL, a node that goes away mid-run costs nothing: the jobs it had not confirmed are published again on
    another node (at least once: a few may then be in the queue twice, with the same message-id).

    Job flags:
      --user USER           resolve this user's tokens in Redis (repeatable)
      --token HEX           send to this device token (repeatable)
      --alert TEXT          payload {"aps":{"alert":TEXT}}; or --payload JSON for a payload of your own
      --title TEXT          with --alert: {"aps":{"alert":{"title":TITLE,"body":TEXT}}}
      --topic TOPIC         bundle id (default: the workers' APNS_TOPIC)
      --push-type TYPE      alert (default), background, voip, ...
      --priority N          10, 5 or 1
      --environment ENV     production (default) or sandbox, for --token
      --collapse-id ID, --expiration UNIX_SECONDS, --id ID
      --deadline UNIX_SECONDS
                            not sent at all if it cannot be handed to APNs by then (expired); unlike --expiration,
                            which is how long APNs keeps it for a device that is offline
      --send-at UNIX_SECONDS
                            held in the broker until then (at most 7 days ahead), sent within a second after
    Other options:
      --check               read FILE (or - for stdin) and report every job a worker would refuse, with its line and
                            reason, on stdout; nothing is published and no broker is needed (a backend's CI can run
                            it on the jobs it generates). A job without "topic" is not refused when APNS_TOPIC is
                            unset: the workers' own APNS_TOPIC decides.
      --bulk                publish to the bulk lane (PUSH_BULK_QUEUE): campaigns and anything that can wait for
                            urgent work; jobs that a person is waiting for (a code, a message) stay on the urgent lane
      --reply-to QUEUE      ask workers for a summary of each job on QUEUE
      --no-progress         no progress output

    Settings it reads (environment, --config file or --set):
    \(SettingTable.help(for: .enqueue))

    EXAMPLES:
      apns-worker enqueue --user alice --user bob --alert "Your order shipped" --topic com.example.app
      apns-worker enqueue --bulk campaign.jsonl
      producer | apns-worker enqueue -
      apns-worker enqueue --check campaign.jsonl

    EXIT CODES: 0 every job published (--check: every job would be accepted), 65 some refused (listed on stderr; the
    rest were published; --check: listed on stdout), 2 bad command line, 69 broker unreachable, 78 bad configuration.
    """

func enqueueCommand(_ arguments: [String]) {
    let parsed = ParsedArguments.parse(
        arguments, command: "enqueue",
        valued: [
            "--user", "--token", "--alert", "--title", "--payload", "--topic", "--push-type", "--priority",
            "--environment", "--collapse-id", "--expiration", "--deadline", "--send-at", "--id", "--reply-to"
        ],
        switches: ["--no-progress", "--bulk", "--check"], help: enqueueHelp)
    let configuration = parsed.configuration(requiringCredentials: false)
    if parsed.switches.contains("--check") { checkJobs(parsed, configuration) }
    let fromFlags = !parsed.all("--user").isEmpty || !parsed.all("--token").isEmpty
    guard fromFlags != (parsed.positionals.count == 1), parsed.positionals.count <= 1 else {
        fail(
            "enqueue: give either a FILE (or - for stdin) or --user/--token flags; try 'apns-worker enqueue --help'",
            code: ExitCode.usage)
    }
    // A job from flags is built before the broker is reached: a flag's mistake is the command line's (exit 2).
    let flagJob = fromFlags ? jobFromFlags(parsed) : nil
    let enqueuer: JobEnqueuer
    do {
        enqueuer = try JobEnqueuer(
            configuration: configuration, replyTo: parsed.value("--reply-to"),
            lane: parsed.switches.contains("--bulk") ? .bulk : .urgent,
            logger: Logger(
                label: "apns-worker", level: configuration.logLevel,
                format: configuration.logFormat))
    } catch {
        failReaching("enqueue", error)
    }
    do {
        if let flagJob {
            try enqueuer.enqueue(flagJob, line: 1)
            try enqueuer.settle()
        } else {
            var reader = try JobReader(path: parsed.positionals[0])
            let bar = ProgressBar(enabled: !parsed.switches.contains("--no-progress"))
            try enqueuer.enqueueAll(from: &reader) { bar.show($0) }
            bar.finish(enqueuer.progress)
        }
    } catch let error as JobReaderError {
        reportRefusals(of: enqueuer)
        fail("enqueue: \(error) (\(enqueuer.progress.published) jobs were published before this)", code: ExitCode.usage)
    } catch {
        fail(
            "enqueue: \(error) (\(enqueuer.progress.published) jobs were published before this)",
            code: ExitCode.unavailable)
    }
    reportRefusals(of: enqueuer)
    print("published \(enqueuer.progress.published) jobs to \(enqueuer.queue), refused \(enqueuer.progress.refused)")
    if !enqueuer.refusals.isEmpty { exit(ExitCode.dataError) }
}

/// `enqueue --check FILE`: each job a worker would refuse on stdout with its line and reason, a count at the end;
/// exit 0 when none would be, 65 when some would.
private func checkJobs(_ parsed: ParsedArguments, _ configuration: WorkerConfiguration) -> Never {
    guard parsed.positionals.count == 1, parsed.all("--user").isEmpty, parsed.all("--token").isEmpty else {
        fail("enqueue --check: give one FILE (or - for stdin); try 'apns-worker enqueue --help'", code: ExitCode.usage)
    }
    do {
        var reader = try JobReader(path: parsed.positionals[0])
        let (jobs, refusals) = try JobEnqueuer.checkAll(
            from: &reader, defaultTopic: configuration.credential.defaultTopic)
        for refusal in refusals { print("refused \(refusal)") }
        print("checked \(jobs) jobs: \(jobs - refusals.count) would be accepted, \(refusals.count) refused")
        exit(refusals.isEmpty ? 0 : ExitCode.dataError)
    } catch {
        fail("enqueue --check: \(error)", code: ExitCode.usage)
    }
}

/// The job the flags describe, as JSON (checked afterwards like any other job), or exit 2 naming the flag.
func jobFromFlags(_ parsed: ParsedArguments) -> [UInt8] {
    var flags = JobFlags()
    let options: [(String, WritableKeyPath<JobFlags, String?>)] = [
        ("--id", \.id), ("--topic", \.topic), ("--environment", \.environment), ("--push-type", \.pushType),
        ("--priority", \.priority), ("--expiration", \.expiration), ("--deadline", \.deadline), ("--send-at", \.sendAt),
        ("--collapse-id", \.collapseID), ("--alert", \.alert), ("--title", \.title), ("--payload", \.payload)
    ]
    for (option, field) in options { flags[keyPath: field] = parsed.value(option) }
    flags.users = parsed.all("--user")
    flags.tokens = parsed.all("--token")
    do { return try flags.body() } catch { fail("enqueue: \(error)", code: ExitCode.usage) }
}

/// Progress on stderr: a bar redrawn in place on a terminal; elsewhere (logs, CI) a line every 5 s.
final class ProgressBar {
    private let enabled: Bool
    private let terminal = isatty(STDERR_FILENO) == 1
    private var lastLine = Date()

    init(enabled: Bool) { self.enabled = enabled }

    func show(_ progress: JobEnqueuer.Progress) {
        guard enabled else { return }
        if terminal {
            write("\r\u{1B}[K" + line(progress))
        } else if Date().timeIntervalSince(lastLine) >= 5 {
            write(line(progress) + "\n")
            lastLine = Date()
        }
    }

    func finish(_ progress: JobEnqueuer.Progress) {
        guard enabled else { return }
        write((terminal ? "\r\u{1B}[K" : "") + line(progress) + "\n")
    }

    private func line(_ progress: JobEnqueuer.Progress) -> String {
        let rate = progress.elapsed > 0 ? Double(progress.published) / progress.elapsed : 0
        var text = ""
        if let total = progress.totalBytes, total > 0 {
            let fraction = min(1, Double(progress.bytesRead) / Double(total))
            let filled = Int(fraction * 30)
            text =
                "[" + String(repeating: "#", count: filled) + String(repeating: ".", count: 30 - filled) + "] "
                + String(format: "%3.0f%% ", fraction * 100)
        }
        return text + "\(progress.published) published, \(progress.refused) refused, "
            + String(format: "%.0f jobs/s, %.1f s", rate, progress.elapsed)
    }

    private func write(_ text: String) { FileHandle.standardError.write(Data(text.utf8)) }
}

/// The first hundred refused lines with their reasons, on stderr.
private func reportRefusals(of enqueuer: JobEnqueuer) {
    for refusal in enqueuer.refusals.prefix(100) {
        FileHandle.standardError.write(Data("apns-worker: enqueue: refused \(refusal)\n".utf8))
    }
    if enqueuer.refusals.count > 100 {
        FileHandle.standardError.write(
            Data("apns-worker: enqueue: ... and \(enqueuer.refusals.count - 100) more\n".utf8))
    }
}
