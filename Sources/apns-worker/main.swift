import Foundation
import Synchronization
import Telemetry
import WorkerPipeline

let usage = """
apns-worker: consumes push jobs from RabbitMQ, resolves users to device tokens in Redis, sends the notifications
to Apple's APNs over persistent HTTP/2 connections, and publishes dead tokens for cleanup.

USAGE: apns-worker [run] [--config FILE] [--set KEY=VALUE ...] [--log-level LEVEL]
       apns-worker --help

OPTIONS:
  --config FILE         settings as KEY=VALUE lines (# comments allowed; config/apns-worker.env is an example)
  --set KEY=VALUE       one setting; repeatable. Flags win over the environment, which wins over the file.
  --log-level LEVEL     the same as --set LOG_LEVEL=LEVEL

Settings come from the environment (see config/apns-worker.env for every key, its default and meaning):
  AMQP_URL              broker (default amqp://guest:guest@127.0.0.1:5672/%2f)
  REDIS_URL             token cache (default redis://127.0.0.1:6379/0)
  APNS_KEY_FILE, APNS_KEY_ID, APNS_TEAM_ID
                        token authentication (.p8 key), or APNS_CERT_FILE [+ APNS_CERT_KEY_FILE] for a certificate
  APNS_TOPIC            topic for jobs that name none
  APNS_PRODUCTION_URL, APNS_SANDBOX_URL, APNS_CA_FILE
                        endpoints (default Apple's) and an extra CA for private ones such as apns-sim
  PUSH_JOBS_QUEUE, PUSH_DEAD_TOKENS_QUEUE, PUSH_FAILED_QUEUE
                        queues (default push.jobs, push.dead-tokens, push.failed)
  METRICS_HOST, METRICS_PORT
                        GET /metrics (Prometheus), /healthz, /readyz (default 0.0.0.0:9464; port 0 = off)

A job is one JSON message on PUSH_JOBS_QUEUE:
  {"id": "job-42", "topic": "com.example.app", "users": ["u1"], "tokens": ["<hex>"],
   "push_type": "alert", "priority": 10, "payload": {"aps": {"alert": "Hello"}}}

SIGTERM or SIGINT stops consuming and finishes the jobs under way (SHUTDOWN_TIMEOUT, default 25 s);
a second signal exits at once.

EXIT CODES:
  0   stopped on a signal after finishing its work
  2   bad command line
  78  bad configuration (the message names the key)
"""

func fail(_ message: String, code: Int32) -> Never {
    FileHandle.standardError.write(Data("apns-worker: \(message)\n".utf8))
    exit(code)
}

var arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "run" { arguments.removeFirst() }
var configFile: String?
var flags: [String: String] = [:]
while let argument = arguments.first {
    arguments.removeFirst()
    switch argument {
    case "-h", "--help", "help":
        print(usage)
        exit(0)
    case "--config", "--set", "--log-level":
        guard let value = arguments.first else { fail("\(argument) needs a value; try 'apns-worker --help'", code: 2) }
        arguments.removeFirst()
        if argument == "--config" {
            configFile = value
        } else if argument == "--log-level" {
            flags["LOG_LEVEL"] = value
        } else {
            guard let equals = value.firstIndex(of: "="), equals != value.startIndex else {
                fail("--set wants KEY=VALUE, got \(value)", code: 2)
            }
            flags[String(value[..<equals])] = String(value[value.index(after: equals)...])
        }
    default:
        fail("unknown argument \(argument); try 'apns-worker --help'", code: 2)
    }
}

let configuration: WorkerConfiguration
do {
    let file = try configFile.map { path throws(ConfigurationError) in try ConfigurationSources.readFile(path) } ?? [:]
    configuration = try WorkerConfiguration.load(from: ConfigurationSources.merge(
        file: file, environment: ProcessInfo.processInfo.environment, flags: flags))
} catch {
    fail("configuration error: \(error)", code: 78)
}
let logger = Logger(label: "apns-worker", level: configuration.logLevel, format: configuration.logFormat)
let worker: Worker
do { worker = try Worker(configuration: configuration, logger: logger) } catch {
    fail("configuration error: \(error)", code: 78)
}

var health: HealthServer?
if configuration.metricsPort > 0 {
    do {
        health = try HealthServer(host: configuration.metricsHost, port: configuration.metricsPort,
                                  metrics: { worker.statistics.prometheusText(ready: worker.isReady) },
                                  ready: { worker.isReady })
    } catch { fail("configuration error: METRICS_PORT: \(error)", code: 78) }
    logger.info("metrics and health endpoint", ["http.address": "\(configuration.metricsHost):\(health!.port)"])
}

signal(SIGINT, SIG_IGN)
signal(SIGTERM, SIG_IGN)
signal(SIGPIPE, SIG_IGN)
let signalCount = Atomic<Int>(0)
let signalSources = [SIGINT, SIGTERM].map { number in
    let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
    source.setEventHandler {
        // Signals that arrive together are coalesced into one call; `data` says how many there were.
        if signalCount.add(max(1, Int(source.data)), ordering: .relaxed).newValue > 1 {
            logger.warning("second signal: exiting now; unfinished jobs return to the queue")
            // _exit, not exit: no atexit handlers that could wait on the threads still working.
            _exit(1)
        }
        logger.info("signal received: stopping", ["signal": String(number)])
        worker.stop()
    }
    source.resume()
    return source
}

let finished = DispatchSemaphore(value: 0)
let broker = Thread {
    worker.run()
    finished.signal()
}
broker.name = "broker"
broker.start()
finished.wait()
health?.shutdown()
_ = signalSources
exit(0)
