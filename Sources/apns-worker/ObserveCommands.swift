import Configuration
import Foundation
import Operations
import Telemetry
import WorkerPipeline

let statsHelp = """
    apns-worker stats: how the whole system is doing, from the broker and Redis (no worker is asked).

    USAGE: apns-worker stats [--minutes N] [--json] [--watch [SECONDS]]

    Shows both lanes (urgent: PUSH_JOBS_QUEUE, bulk: PUSH_BULK_QUEUE) with their depth, consumers, the jobs per
    second workers took from each and the notifications per second they sent from each, and the longest a job taken
    in the window had waited in its queue (from the jobs' timestamp, which `enqueue` sets; "-" when no timed job was
    taken: a lane nobody consumes shows its depth, and no wait). Then each queue's depth and consumers (the lanes,
    their retry delay queues, per lane the jobs waiting for their send_at in its schedule tiers as one row, dead
    tokens, failed, registrations), what all workers together did over the last N
    minutes (default 5; notifications delivered, dead tokens, failures, expired, retries, jobs) with the rate per
    second, and the workers that reported in the last 30 s (workers report every 5 s to Redis: apns:stats:<minute>,
    apns:stats:<minute>:waited and apns:workers).

      --minutes N        the window of the totals (default 5; with --watch at least 2, so that a frame's rates see
                         every minute the interval touched)
      --json             one JSON object (with --watch: one line per frame, {"at", "rates_per_second", "report"})
      --watch [SECONDS]  the live view: the report again every SECONDS (default 5, the workers' reporting interval;
                         1 to 300), with what all workers did per second since the previous frame on top. On a
                         terminal each frame replaces the last; into a pipe or file, frames follow each other as
                         plain lines. Ctrl-C stops it (exit 0); a broker or Redis that stops answering is reported in
                         the frame and asked again at the next one.

    EXAMPLES:
      apns-worker stats
      apns-worker stats --watch           # redraws every 5 s
      apns-worker stats --watch 2 --minutes 1

    Settings it reads (environment, --config file or --set):
    \(SettingTable.help(for: .stats))

    EXIT CODES: 0 done, 2 bad command line, 69 broker or Redis unreachable, 78 bad configuration.
    """

func statsCommand(_ arguments: [String]) {
    let (remaining, watchInterval) = takeWatchOption(arguments)
    let parsed = ParsedArguments.parse(
        remaining, command: "stats", valued: ["--minutes"], switches: ["--json"],
        help: statsHelp)
    if let extra = parsed.positionals.first { fail("stats: unexpected argument \(extra)", code: ExitCode.usage) }
    let minutes = parsed.integer("--minutes", default: 5, range: 1...1440, command: "stats")
    let configuration = parsed.configuration(requiringCredentials: false)
    let json = parsed.switches.contains("--json")
    if let watchInterval {
        watchStats(configuration, minutes: minutes, interval: watchInterval, json: json)
    }
    do {
        let report = try StatsReport.collect(configuration, windowMinutes: minutes)
        print(json ? report.json : report.text)
    } catch {
        failReaching("stats", error)
    }
}

/// `--watch`, `--watch SECONDS` or `--watch=SECONDS` taken out of `arguments` (its value is optional, which the
/// common parser does not do): the rest, and the interval if the option was there.
private func takeWatchOption(_ arguments: [String]) -> (rest: [String], interval: Double?) {
    var rest: [String] = []
    var interval: Double?
    var index = 0
    func seconds(_ text: String) -> Double {
        guard let value = Double(text), (1...300).contains(value) else {
            fail("stats: --watch wants seconds from 1 to 300, got \(text)", code: ExitCode.usage)
        }
        return value
    }
    while index < arguments.count {
        let argument = arguments[index]
        if argument == "--watch" {
            interval = 5
            if index + 1 < arguments.count, !arguments[index + 1].hasPrefix("-") {
                interval = seconds(arguments[index + 1])
                index += 1
            }
        } else if argument.hasPrefix("--watch=") {
            interval = seconds(String(argument.dropFirst("--watch=".count)))
        } else {
            rest.append(argument)
        }
        index += 1
    }
    return (rest, interval)
}

/// The live view: a frame every `interval` seconds until Ctrl-C (exit 0). Reads what `stats` reads, each time.
private func watchStats(_ configuration: WorkerConfiguration, minutes: Int, interval: Double, json: Bool) -> Never {
    let terminal = isatty(STDOUT_FILENO) == 1
    signal(SIGINT) { _ in
        // Leave the cursor on a fresh line and exit 0: stopping the view is how it ends.
        _ = write(STDOUT_FILENO, "\n", 1)
        _exit(0)
    }
    // A parent may start this with SIGINT blocked (the mask is inherited): the handler must still run.
    var interrupt = sigset_t()
    sigemptyset(&interrupt)
    sigaddset(&interrupt, SIGINT)
    pthread_sigmask(SIG_UNBLOCK, &interrupt, nil)
    // Enough minutes that the interval's growth is all inside the window read.
    let window = max(minutes, Int(interval / 60) + 2)
    var previous: (report: StatsReport, time: Date)?
    while true {
        let now = Date()
        var frame: String
        do {
            let report = try StatsReport.collect(configuration, windowMinutes: window)
            let rates = previous.map { report.rates(since: $0.report, seconds: now.timeIntervalSince($0.time)) }
            frame =
                json
                ? report.watchJSON(at: now, rates: rates) : report.watchFrame(at: now, rates: rates, interval: interval)
            previous = (report, now)
        } catch {
            frame =
                "apns-worker stats at \(now.formatted(.iso8601)): broker or Redis not answering (\(error)); "
                + "asking again in \(Int(interval)) s"
        }
        // On a terminal: home, clear, the frame. Elsewhere: the frame and a blank line, so that a log keeps them all.
        let output = terminal && !json ? "\u{1B}[H\u{1B}[2J" + frame + "\n" : frame + (json ? "\n" : "\n\n")
        FileHandle.standardOutput.write(Data(output.utf8))
        Thread.sleep(forTimeInterval: max(0, interval - Date().timeIntervalSince(now)))
    }
}

let deadTokensHelp = """
    apns-worker dead-tokens tail: print dead-token events as workers publish them, one JSON line each.

    USAGE: apns-worker dead-tokens tail [--count N] [--timeout SECONDS] [--full-tokens]

    Watches through a temporary queue of its own bound to PUSH_DEAD_TOKENS_EXCHANGE (default: named like PUSH_DEAD_TOKENS_QUEUE), so the
    cleanup consumers still receive every event; it sees events published while it runs, not those already queued.
    Tokens are shortened (first 8 characters and length) unless --full-tokens.
      --count N          stop after N events
      --timeout SECONDS  stop when no event came for this long, up to 604800 (a week) (exit 0)

    Settings it reads (environment, --config file or --set):
    \(SettingTable.help(for: .deadTokensTail))

    EXAMPLES:
      apns-worker dead-tokens tail
      apns-worker dead-tokens tail --count 10 --timeout 60 | jq .reason

    EXIT CODES: 0 done, 2 bad command line, 69 broker unreachable, 78 bad configuration.
    """

func deadTokensCommand(_ arguments: [String]) {
    let parsed = ParsedArguments.parse(
        arguments, command: "dead-tokens", valued: ["--count", "--timeout"],
        switches: ["--full-tokens"], help: deadTokensHelp)
    guard parsed.positionals == ["tail"] else {
        fail("dead-tokens: the only action is tail; try 'apns-worker dead-tokens --help'", code: ExitCode.usage)
    }
    let count = parsed.integer("--count", default: Int.max, range: 1...Int.max, command: "dead-tokens tail")
    let timeout = parsed.seconds("--timeout", range: 0.001...604_800, command: "dead-tokens tail")
    let configuration = parsed.configuration(requiringCredentials: false)
    let full = parsed.switches.contains("--full-tokens")
    do {
        let watcher = try DeadTokenWatcher(
            configuration: configuration,
            logger: Logger(
                label: "apns-worker", level: configuration.logLevel,
                format: configuration.logFormat))
        FileHandle.standardError.write(
            Data("apns-worker: watching \(configuration.broker.queues.deadTokensExchange)\n".utf8))
        var seen = 0
        while seen < count, let body = try watcher.next(timeout: timeout) {
            seen += 1
            var line: [UInt8]
            if full {
                line = body
            } else if let event = try? DeadTokenEvent.decode(body) {
                line = event.redactedJSON
            } else {
                line = Array("{\"unreadable_event_bytes\":\(body.count)}".utf8)
            }
            // Unbuffered, so a pipe (`| jq`, `| grep`) sees each event when it arrives.
            line.append(UInt8(ascii: "\n"))
            FileHandle.standardOutput.write(Data(line))
        }
    } catch {
        if let named = ConfigurationError(naming: error) {
            fail("configuration error: \(named)", code: ExitCode.configuration)
        }
        failReaching("dead-tokens tail", error)
    }
}

let cleanupHelp = """
    apns-worker cleanup: keep the token cache true to what APNs and the apps say (the token lifecycle).

    USAGE: apns-worker cleanup [--once] [--config FILE] [--set KEY=VALUE ...]

      - consumes PUSH_DEAD_TOKENS_QUEUE: each dead token leaves the cache, unless the app registered it again after the
        event's timestamp (a direct token's owner is found through apns:owner:<token>);
      - consumes PUSH_REGISTRATIONS_QUEUE (default push.registrations), where an app's backend reports each launch:
          {"user": "u1", "token": "<hex>", "environment": "production", "timestamp": 1732900000000,
           "device": {"model": "iPhone15,2", "os": "17.1"}, "action": "register"}
        A registration newer than what is known writes the token with its time (moving it from a previous user);
        "action": "unregister" (a logout) removes it unless registered again later. Older events change nothing.
      - every CLEANUP_SWEEP_INTERVAL seconds (default 3600) removes tokens not registered for CLEANUP_INACTIVE_DAYS
        (default 90). Tokens with no registration time, or one that is not milliseconds since 2001 (seconds, text),
        are kept: their age is unknown.
    Unreadable messages are parked on PUSH_FAILED_QUEUE with the reason in the x-apns-worker-reason header.
    Serves GET /metrics, /healthz, /readyz on METRICS_HOST:METRICS_PORT like the worker (give it another port when
    both run on one host). One cleanup process is enough for most fleets; more can run side by side.

      --once     process what is queued, sweep once, and exit (for a cron job)

    Settings it reads (environment, --config file or --set):
    \(SettingTable.help(for: .cleanup))

    EXAMPLES:
      apns-worker cleanup --config /etc/apns-worker/apns-worker.env
      apns-worker cleanup --once --set CLEANUP_INACTIVE_DAYS=120     # from cron

    EXIT CODES: 0 done or stopped on a signal, 2 bad command line, 69 broker or Redis unreachable (--once),
    78 bad configuration.
    """

func cleanupCommand(_ arguments: [String]) {
    let parsed = ParsedArguments.parse(
        arguments, command: "cleanup", valued: [], switches: ["--once"], help: cleanupHelp)
    if let extra = parsed.positionals.first { fail("cleanup: unexpected argument \(extra)", code: ExitCode.usage) }
    let configuration = parsed.configuration(requiringCredentials: false)
    let logger = Logger(label: "apns-cleanup", level: configuration.logLevel, format: configuration.logFormat)
    let cleanup = TokenCleanup(configuration: configuration, logger: logger)
    if parsed.switches.contains("--once") {
        do { try cleanup.run(untilIdle: true) } catch { failReaching("cleanup", error) }
        logger.info("cleanup done", ["stats": cleanup.statistics.summary])
        return
    }
    runService(cleanup, name: "cleanup", metrics: configuration.metrics, logger: logger)
    logger.info("cleanup stopped", ["stats": cleanup.statistics.summary])
}
