import Configuration
import Foundation
import Telemetry
import WorkerPipeline

let runHelp = """
    apns-worker run: consume push jobs and deliver them (the default command).

    USAGE: apns-worker [run] [--config FILE] [--set KEY=VALUE ...] [--log-level LEVEL]

    Consumes two lanes, PUSH_JOBS_QUEUE (urgent, prefetch WORKER_PREFETCH) and PUSH_BULK_QUEUE (bulk, prefetch
    WORKER_BULK_PREFETCH at most, as many as fit in WORKER_BULK_PREFETCH_BYTES), urgent work always first; resolves
    users through the Redis token cache, sends each notification to APNs over APNS_CONNECTIONS persistent HTTP/2
    connections per environment and lane, publishes dead tokens (to the PUSH_DEAD_TOKENS_EXCHANGE fanout, bound to
    PUSH_DEAD_TOKENS_QUEUE), retries through delay queues of the job's lane, drops what missed its job's deadline
    (expired), parks what cannot be sent on PUSH_FAILED_QUEUE, and acknowledges a job once all of it is settled.

    Run as many workers as the rate needs, on any number of machines: they share the broker, Redis and the rate limit.

    Settings (environment, --config file or --set; config/apns-worker.env lists every key with its default):
    \(SettingTable.help(for: .worker))

    Signals: SIGTERM or SIGINT stops consuming and finishes the jobs under way (at most SHUTDOWN_TIMEOUT, default
    25 s); a second signal exits at once (code 1) and the broker redelivers what was unfinished. SIGHUP reads the APNs
    credentials again (APNS_CREDENTIALS_FILE and the single-key settings): changed ones get new connections while the old
    finish their streams; a reload that fails is logged and changes nothing.

    EXAMPLE:
      AMQP_URL=amqp://app:secret@rabbit:5672/%2f REDIS_URL=redis://redis:6379/0 \\
      APNS_KEY_FILE=/etc/apns/AuthKey.p8 APNS_KEY_ID=ABC123DEFG APNS_TEAM_ID=DEF123GHIJ APNS_TOPIC=com.example.app \\
      apns-worker run --log-level info

    EXIT CODES: 0 stopped after finishing, 1 second signal, 2 bad command line, 78 bad configuration (a setting, or
    the broker or Redis refusing the credentials, vhost or database in AMQP_URL or REDIS_URL at start; a broker or
    Redis that is merely down is waited for).
    """

func runCommand(_ arguments: [String]) {
    let parsed = ParsedArguments.parse(arguments, command: "run", valued: [], switches: [], help: runHelp)
    if let extra = parsed.positionals.first {
        fail("run: unexpected argument \(extra); try 'apns-worker run --help'", code: ExitCode.usage)
    }
    let configuration = parsed.configuration(requiringCredentials: true)
    let logger = Logger(label: "apns-worker", level: configuration.logLevel, format: configuration.logFormat)
    let worker: ReloadableWorker
    do {
        // A reload (SIGHUP) reads the settings file, the environment and the flags again, as at start.
        worker = try configuration.makeWorker(logger: logger) {
            try parsed.loadConfiguration(requiringCredentials: true)
        }
    } catch {
        fail("configuration error: \(error)", code: ExitCode.configuration)
    }
    runService(worker, name: "broker", metrics: configuration.metrics, logger: logger)
}
