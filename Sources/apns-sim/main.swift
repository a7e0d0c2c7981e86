import APNs
import APNsSimulator
import Foundation
import HTTP2
import TLS
import Telemetry

let usage = """
    apns-sim: an APNs double for tests and staging. Speaks HTTP/2 over TLS (ALPN h2) like api.push.apple.com,
    validates requests like APNs and answers like it.

    USAGE: apns-sim [options]

    OPTIONS:
      --host HOST                 address to listen on (default 127.0.0.1)
      --port PORT                 port to listen on (default 2197; 0 picks a free one)
      --cert FILE --key FILE      PEM certificate and key to serve (default: a fresh self-signed pair)
      --write-cert FILE           write the served certificate there, for clients to trust (APNS_CA_FILE)
      --cert-host NAME            a name the generated certificate is also valid for (e.g. apns-sim in a compose
                                  network); repeatable
      --generate-key FILE         write a fresh provider key (.p8, PKCS#8 P-256, as Apple issues them) and exit
      --unregistered TOKEN[@MS]   answer 410 Unregistered for TOKEN, with timestamp MS (ms since epoch; default now);
                                  repeatable
      --trust-key KID:TEAM:FILE   verify provider tokens (JWT): key id KID of team TEAM, public or private key FILE
                                  (PEM); repeatable. Without it any bearer token is accepted.
      --client-ca FILE            certificate authentication: clients present a certificate issued by (or equal to) the
                                  PEM certificate in FILE; a common name that is a bundle ID (or "Apple Push Services:
                                  <bundle ID>", as Apple issues them) serves that app's topics only.
                                  With --trust-key, clients without a certificate use provider tokens instead
      --token-topic TOKEN=TOPIC   TOKEN was issued for TOPIC (the full topic: com.example.app for a device token,
                                  com.example.app.voip for a PushKit token, ...): pushes to it with any other topic are
                                  answered 400 DeviceTokenNotForTopic, as APNs does. TOKEN ending in * is a prefix rule
                                  (ab12*=com.example.app.voip). Repeatable; the first matching rule applies; tokens
                                  no rule names serve any topic.
      --token-environment TOKEN=production|sandbox
                                  TOKEN belongs to that environment: a token of the environment this simulator does not
                                  play (production, or sandbox with --development) is answered 400 BadDeviceToken, as
                                  Apple's sandbox answers a production token. Prefix rules and repetition as above.
      --max-streams N             SETTINGS_MAX_CONCURRENT_STREAMS (default 1000)
      --threads N                 serve connections on N threads (default 2), spread in the order they arrive: as at
                                  APNs, one connection kept busy does not make the others wait
      --development               play the development environment: answers also carry apns-unique-id (production,
                                  the default, sends only apns-id)

    FAULTS (what real APNs deployments meet):
      --bad-token TOKEN           answer 400 BadDeviceToken for TOKEN; repeatable
      --throttle TOKEN            answer 429 TooManyRequests for TOKEN; repeatable
      --internal-error-rate F     answer this fraction (0..1) of pushes 500 InternalServerError
      --unavailable-rate F        answer this fraction (0..1) of pushes 503 ServiceUnavailable
      --latency-ms MS             wait MS milliseconds before every answer
      --latency-jitter-ms MS      and up to MS milliseconds more, drawn per answer (answers come back out of order)
      --goaway-after N            send GOAWAY {"reason":"Shutdown"} after N streams on a connection
      --drop-after N              drop the TCP connection, unanswered, at stream N+1 of a connection
      --refuse-every N            reset every N-th stream with REFUSED_STREAM
      --drop-streams-to-one       SETTINGS_MAX_CONCURRENT_STREAMS falls to 1 after a rejected push, back after a success
      --ignore-pings              leave PINGs unanswered, as a silently dead connection does
      --count-distinct            count the distinct device tokens answered 200 (/sim/stats accepted_distinct), to tell
                                  deliveries from duplicates
      --log-level LEVEL           trace, debug, info, warning, error (default info)
      -h, --help                  this text

    CONTROL:
      GET /sim/stats on the same port answers {"received": N, "by_status": {...}, "by_credential": {...},
      "latency_us": {"count": ..., "p50": ..., "p99": ..., "max": ...}} (by_credential: pushes per verified provider key
      "TEAMID/KEYID" or client certificate "certificate:<common name>"; latency from the "sent_at_us" stamp apns-bench
      puts in payloads to the answer, kept in buckets: p50 and p99 within 1/64 of their value, exact below 128 us,
      max exact); POST /sim/reset-latency clears the latencies;
      POST /sim/goaway sends GOAWAY on that connection; POST /sim/outage?seconds=N answers every push 500
      InternalServerError for the next N seconds.
      On SIGINT or SIGTERM it prints the same counts and exits 0.

    EXAMPLE:
      apns-sim --port 2197 --write-cert /tmp/sim.pem --unregistered 0badc0ffee
      APNS_PRODUCTION_URL=https://127.0.0.1:2197 APNS_CA_FILE=/tmp/sim.pem apns-worker
    """

// SIGINT, SIGTERM and SIGHUP wait for the runner (sigwait) from the first instruction, before any thread exists.
ServiceRunner.blockServiceSignals()

/// Unbuffered, so a script reading the pipe sees the line at once.
func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("apns-sim: \(message)\nTry 'apns-sim --help'.\n".utf8))
    exit(2)
}

var configuration = APNsSimulator.Configuration(port: 2197, recordsNotifications: false)
configuration.threads = 2
var certificateFile: String?
var keyFile: String?
var writeCertificate: String?
var certificateHosts = ["localhost", "127.0.0.1", "::1"]
var level = Logger.Level.info
var arguments = CommandLine.arguments.dropFirst()

@MainActor func value(for flag: String) -> String {
    guard let next = arguments.popFirst() else { fail("\(flag) needs a value") }
    return next
}

while let argument = arguments.popFirst() {
    switch argument {
    case "-h", "--help":
        print(usage)
        exit(0)
    case "--host": configuration.host = value(for: argument)
    case "--port":
        let text = value(for: argument)
        guard let port = Int(text), (0...65535).contains(port) else { fail("--port: \(text) is not a port number") }
        configuration.port = port
    case "--cert": certificateFile = value(for: argument)
    case "--key": keyFile = value(for: argument)
    case "--write-cert": writeCertificate = value(for: argument)
    case "--cert-host": certificateHosts.append(value(for: argument))
    case "--count-distinct": configuration.countsDistinctAccepted = true
    case "--generate-key":
        let path = value(for: argument)
        do {
            // Owner-only, as a real key file should be.
            guard
                FileManager.default.createFile(
                    atPath: path, contents: Data(try ES256Key.generatePrivateKeyPEM().utf8),
                    attributes: [.posixPermissions: 0o600])
            else {
                fail("cannot write \(path)")
            }
        } catch { fail("cannot generate a key: \(error)") }
        say("apns-sim wrote a provider key to \(path)")
        exit(0)
    case "--unregistered":
        let text = value(for: argument)
        let parts = text.split(separator: "@", maxSplits: 1)
        let token = String(parts[0])
        guard !token.isEmpty, token.count % 2 == 0, token.allSatisfy(\.isHexDigit) else {
            fail("--unregistered: \(text) is not a hex token")
        }
        var milliseconds = Int64(Date().timeIntervalSince1970 * 1000)
        if parts.count == 2 {
            guard let given = Int64(parts[1]) else { fail("--unregistered: \(parts[1]) is not milliseconds") }
            milliseconds = given
        }
        configuration.unregisteredTokens[token] = milliseconds
    case "--trust-key":
        let text = value(for: argument)
        let parts = text.split(separator: ":", maxSplits: 2).map(String.init)
        guard parts.count == 3 else { fail("--trust-key wants KID:TEAM:FILE, got \(text)") }
        do {
            configuration.trustedKeys[parts[0]] = .init(teamID: parts[1], key: try ES256Key(contentsOfFile: parts[2]))
        } catch { fail("--trust-key: \(error)") }
    case "--client-ca":
        let path = value(for: argument)
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            fail("--client-ca: cannot read \(path)")
        }
        configuration.clientCertificateCA = text
    case "--token-topic", "--token-environment":
        let text = value(for: argument)
        let parts = text.split(separator: "=", maxSplits: 1).map(String.init)
        guard parts.count == 2, !parts[1].isEmpty else { fail("\(argument) wants TOKEN=VALUE, got \(text)") }
        let hex = parts[0].hasSuffix("*") ? String(parts[0].dropLast()) : parts[0]
        guard !hex.isEmpty, hex.utf8.allSatisfy({ $0 < 0x80 && Character(Unicode.Scalar($0)).isHexDigit }) else {
            fail("\(argument): \(parts[0]) is not a hex token or a hex prefix ending in *")
        }
        let rule = APNsSimulator.TokenRule(pattern: parts[0], value: parts[1])
        if argument == "--token-topic" {
            configuration.behaviour.tokenTopics.append(rule)
        } else {
            guard APNsEnvironment(rawValue: parts[1]) != nil else {
                fail("--token-environment: \(parts[1]) is neither production nor sandbox")
            }
            configuration.behaviour.tokenEnvironments.append(rule)
        }
    case "--threads":
        let text = value(for: argument)
        guard let threads = Int(text), (1...64).contains(threads) else {
            fail("--threads: \(text) is not a number 1..64")
        }
        configuration.threads = threads
    case "--max-streams":
        let text = value(for: argument)
        guard let streams = UInt32(text), streams > 0 else { fail("--max-streams: \(text) is not a positive number") }
        configuration.maximumConcurrentStreams = streams
    case "--bad-token": configuration.behaviour.badTokens.insert(value(for: argument))
    case "--throttle": configuration.behaviour.throttledTokens.insert(value(for: argument))
    case "--internal-error-rate", "--unavailable-rate":
        let text = value(for: argument)
        guard let rate = Double(text), (0...1).contains(rate) else {
            fail("\(argument): \(text) is not a fraction 0..1")
        }
        if argument == "--internal-error-rate" {
            configuration.behaviour.internalErrorRate = rate
        } else {
            configuration.behaviour.unavailableRate = rate
        }
    case "--latency-ms", "--latency-jitter-ms":
        let text = value(for: argument)
        guard let milliseconds = Double(text), (0...600_000).contains(milliseconds) else {
            fail("\(argument): \(text) is not milliseconds from 0 to 600000 (ten minutes)")
        }
        if argument == "--latency-ms" {
            configuration.behaviour.latency = milliseconds / 1000
        } else {
            configuration.behaviour.latencyJitter = milliseconds / 1000
        }
    case "--goaway-after", "--drop-after", "--refuse-every":
        let text = value(for: argument)
        guard let count = Int(text), count > 0 else { fail("\(argument): \(text) is not a positive number") }
        switch argument {
        case "--goaway-after": configuration.behaviour.goAwayAfterStreams = count
        case "--drop-after": configuration.behaviour.dropConnectionAfterStreams = count
        default: configuration.behaviour.refuseEveryNthStream = count
        }
    case "--drop-streams-to-one": configuration.behaviour.dropsStreamLimitAfterRejection = true
    case "--ignore-pings": configuration.behaviour.ignoresPings = true
    case "--development": configuration.isDevelopment = true
    case "--log-level":
        let text = value(for: argument)
        guard let parsed = Logger.Level(name: text) else { fail("--log-level: unknown level \(text)") }
        level = parsed
    default:
        fail("unknown option \(argument)")
    }
}

if (certificateFile == nil) != (keyFile == nil) { fail("--cert and --key go together") }
do {
    if let certificateFile, let keyFile {
        configuration.certificatePEM = try String(contentsOfFile: certificateFile, encoding: .utf8)
        configuration.privateKeyPEM = try String(contentsOfFile: keyFile, encoding: .utf8)
    } else {
        (configuration.certificatePEM, configuration.privateKeyPEM) = try SelfSignedCertificate.generate(
            hosts: certificateHosts)
    }
} catch { fail("cannot read or make the certificate or key: \(error)") }

let logger = Logger(label: "apns-sim", level: level)
let simulator: APNsSimulator
do { simulator = try APNsSimulator(configuration: configuration, logger: logger) } catch { fail("\(error)") }
if let writeCertificate {
    do { try simulator.certificatePEM.write(toFile: writeCertificate, atomically: true, encoding: .utf8) } catch {
        fail("cannot write \(writeCertificate): \(error.localizedDescription)")
    }
}

func printCounts() {
    let counts = simulator.countsByStatus()
    let summary = counts.keys.sorted().map { "\($0)=\(counts[$0]!)" }.joined(separator: " ")
    say("apns-sim received \(counts.values.reduce(0, +)) notifications \(summary)")
}

/// The simulator as a `Service`: it serves on its own loop until the first signal.
final class SimulatorService: Service {
    private let stopped = DispatchSemaphore(value: 0)
    func run() { stopped.wait() }
    func stop() { stopped.signal() }
    var isReady: Bool { true }
    var metricsText: String { "" }
}

say("apns-sim listening on https://\(configuration.host):\(simulator.port)")
_ = ServiceRunner.run(SimulatorService(), name: "apns-sim", logger: logger)
printCounts()
simulator.shutdown()
exit(0)
