import AMQP
import APNs
import Foundation
import HTTP2
import Synchronization
import Telemetry
import Threads

let usage = """
    apns-bench: load generators for scripts/bench (figures, never pass/fail).

    USAGE:
      apns-bench client --url URL [--ca FILE] [--connections C] [--streams M] [--requests N]
                        [--key FILE --key-id KID --team-id TEAM] [--token HEX] [--topic TOPIC]
          Sends N notifications through the project's APNs client with C connections, keeping C*M in flight
          (like `h2load -c C -m M -n N`), and prints one line: requests, seconds, requests per second, statuses.
      apns-bench jwt --key FILE --key-id KID --team-id TEAM
          Prints an authorization header value (bearer JWT) for other load tools.
      apns-bench fill --amqp URL --queue Q --jobs N [--tokens K] [--users U --user-prefix P [--rotate-users M]]
                      [--first F] [--rate R] [--unstamped]
                      [--topics A,B,...] [--environment production|sandbox]
                      [--queue-type classic|quorum]
          Publishes N persistent jobs (with publisher confirms): K direct tokens each, or U users each (P0, P1, ...).
          Each payload carries "sent_at_us" (publish time), from which apns-sim measures publish-to-APNs latency;
          --unstamped leaves it out (a backlog whose notifications must not count in the latency figures).
          --rate R paces publishing at R jobs per second (steady load for latency; default: as fast as possible).
          --topics A,B names topic A in job 0, B in job 1, and so on round the list (default: none, the worker's
          APNS_TOPIC), so that several credentials share the load. --environment names the direct tokens' environment
          (default: none, production).
      apns-bench drain --amqp URL --queue Q --count N [--prefetch P] [--ack-every K] [--ack-lag L]
          The broker's own consume-and-acknowledge ceiling: consumes N messages, acknowledging each (K = 1) or K at a
          time with multiple acks, and prints the rate. --ack-lag L acknowledges only up to L messages behind the
          newest, as a worker does that acknowledges a job once APNs has answered it (L below the prefetch).
      apns-bench wait --sim URL --ca FILE --count N
          Waits until apns-sim has answered N pushes (GET /sim/stats) and prints how long that took from the start,
          and from the first answer it saw (what came before is the sender's start-up).
    """

/// Keeps `window` notifications in flight, topping up in batches of `refill` as answers arrive.
final class Driver: Sendable {
    struct Progress {
        var sent = 0
        var completed = 0
        var statuses: [Int: Int] = [:]
    }

    let client: APNsClient
    let notification: APNsNotification
    let total: Int
    let window: Int
    let refill: Int
    let progress = Locked(Progress())
    let done = DispatchSemaphore(value: 0)

    init(client: APNsClient, notification: APNsNotification, total: Int, window: Int, refill: Int) {
        self.client = client
        self.notification = notification
        self.total = total
        self.window = window
        self.refill = refill
    }

    var statuses: [Int: Int] { progress.withLock { $0.statuses } }

    func start() {
        let first = min(window, total)
        progress.withLock { $0.sent = first }
        send(first)
    }

    private func send(_ count: Int) {
        client.send(Array(repeating: notification, count: count)) { [self] _, result in
            let next = progress.withLock { state -> Int in
                state.completed += 1
                state.statuses[result.status ?? -1, default: 0] += 1
                if state.completed == total { done.signal() }
                let room = window - (state.sent - state.completed)
                guard state.sent < total, room >= refill else { return 0 }
                let batch = min(room, total - state.sent)
                state.sent += batch
                return batch
            }
            if next > 0 { send(next) }
        }
    }
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("apns-bench: \(message)\n".utf8))
    exit(2)
}

var arguments = Array(CommandLine.arguments.dropFirst())
guard let mode = arguments.first else { fail("no mode\n\(usage)") }
arguments.removeFirst()
/// Each mode's options: any other is refused, so that a typo (--conections) does not silently run with a default.
let optionsOfMode: [String: Set<String>] = [
    "jwt": ["key", "key-id", "team-id"],
    "client": ["url", "ca", "connections", "streams", "requests", "key", "key-id", "team-id", "token", "topic"],
    "fill": [
        "amqp", "queue", "jobs", "tokens", "users", "user-prefix", "rotate-users", "first", "rate", "unstamped",
        "topics", "environment", "queue-type"
    ],
    "drain": ["amqp", "queue", "count", "prefetch", "ack-every", "ack-lag"],
    "wait": ["sim", "ca", "count"]
]
nonisolated(unsafe) var options: [String: String] = [:]  // written once, before any other thread starts
while !arguments.isEmpty {
    let flag = arguments.removeFirst()
    if flag == "-h" || flag == "--help" {
        print(usage)
        exit(0)
    }
    if flag == "--unstamped" {
        options["unstamped"] = ""
        continue
    }
    guard flag.hasPrefix("--"), !arguments.isEmpty else { fail("bad option \(flag)") }
    guard optionsOfMode[mode]?.contains(String(flag.dropFirst(2))) != false else {
        fail("\(mode) has no option \(flag); see apns-bench --help")
    }
    options[String(flag.dropFirst(2))] = arguments.removeFirst()
}
/// A whole number from `minimum` (1 unless the option's default is 0) to a trillion (counts and job numbers are
/// added and multiplied), or exit naming it.
func integer(_ name: String, _ fallback: Int, minimum: Int = 1) -> Int {
    guard let text = options[name] else { return fallback }
    guard let value = Int(text), (minimum...1_000_000_000_000).contains(value) else {
        fail("--\(name) \(text) is not a whole number from \(minimum) to 1000000000000")
    }
    return value
}

func tokenProvider() -> APNsTokenProvider? {
    guard let keyFile = options["key"] else { return nil }
    do {
        return try APNsTokenProvider(
            key: try ES256Key(contentsOfFile: keyFile), keyID: options["key-id"] ?? "",
            teamID: options["team-id"] ?? "")
    } catch { fail("\(error)") }
}

switch mode {
case "jwt":
    guard let provider = tokenProvider() else { fail("jwt needs --key, --key-id and --team-id") }
    do { print(try provider.authorization()) } catch { fail("\(error)") }
case "client":
    guard let url = options["url"] else { fail("client needs --url") }
    let connections = integer("connections", 1)
    let streams = integer("streams", 100)
    let total = integer("requests", 100_000)
    let endpoint: APNsEndpoint
    do { endpoint = try APNsEndpoint(url: url) } catch { fail("\(error)") }
    let authentication: APNsAuthentication =
        tokenProvider().map { .token($0) }
        ?? .certificate(certificateFile: "", privateKeyFile: nil)
    if case .certificate = authentication { fail("client needs --key, --key-id and --team-id") }
    let client = APNsClient(
        configuration: .init(
            production: endpoint, caFile: options["ca"],
            connectionsPerEnvironment: connections),
        authentication: authentication, logger: Logger(label: "apns-bench", level: .error))
    let notification = APNsNotification(
        deviceToken: options["token"] ?? String(repeating: "ab", count: 32),
        topic: options["topic"] ?? "com.example.app",
        payload: Array(
            #"{"aps":{"alert":{"title":"Benchmark","body":"A notification of a realistic size"},"badge":1}}"#.utf8))

    // Warm-up: open every connection before the clock starts, as h2load does before its first request.
    let warm = DispatchSemaphore(value: 0)
    client.send(Array(repeating: notification, count: connections * 2)) { _, _ in warm.signal() }
    for _ in 0..<(connections * 2) { warm.wait() }

    let window = connections * streams
    let driver = Driver(
        client: client, notification: notification, total: total, window: window,
        refill: max(1, window / 4))
    let started = DispatchTime.now().uptimeNanoseconds
    driver.start()
    driver.done.wait()
    let seconds = Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9
    let statuses = driver.statuses
    let statusText = statuses.keys.sorted().map { "\($0)=\(statuses[$0]!)" }.joined(separator: " ")
    print(
        String(
            format: "client: %d requests in %.3f s = %.0f req/s, connections=%d streams=%d, statuses %@",
            total, seconds, Double(total) / seconds, connections, streams, statusText))
    client.shutdown()
case "fill":
    guard let url = options["amqp"], let queue = options["queue"] else { fail("fill needs --amqp and --queue") }
    let jobs = integer("jobs", 10_000)
    let tokensPerJob = integer("tokens", 1)
    let usersPerJob = options["users"] == nil ? 0 : integer("users", 100)
    let userPrefix = options["user-prefix"] ?? "bench-user-"
    // Job n names users (n * U + i) modulo M: jobs of one user each then reach M users in turn.
    let rotatedUsers = options["rotate-users"].map { _ in integer("rotate-users", 1000) }
    // Jobs are numbered from F (their ids and direct tokens): a warm-up and the measured jobs do not share them.
    let first = integer("first", 0, minimum: 0)
    let stamped = options["unstamped"] == nil
    let rate = options["rate"].map { text -> Double in
        guard let rate = Double(text), (0.001...10_000_000).contains(rate) else {
            fail("--rate \(text) is not a number of jobs per second from 0.001 to 10000000")
        }
        return rate
    }
    // Job n names topic n modulo the list (none: the worker's APNS_TOPIC), so that several credentials share the load.
    let topics = options["topics"].map { $0.split(separator: ",").map(String.init) } ?? []
    let environment = options["environment"].map { "\"environment\": \"\($0)\", " } ?? ""
    do {
        let connection = try AMQPNodes(url).connect(startingAt: 0)
        let type = options["queue-type"] ?? "classic"
        guard type == "classic" || type == "quorum" else { fail("--queue-type is classic or quorum, not \(type)") }
        try connection.declareQueue(queue, arguments: type == "quorum" ? ["x-queue-type": .string("quorum")] : [:])
        try connection.enablePublisherConfirms()
        let started = DispatchTime.now().uptimeNanoseconds
        var last: UInt64 = 0
        for job in first..<(first + jobs) {
            if let rate {
                // Pacing: publish job n at n / rate seconds after the start.
                let due = started + UInt64(Double(job - first) / rate * 1e9)
                let now = DispatchTime.now().uptimeNanoseconds
                if due > now { usleep(UInt32(min(1_000_000, (due - now) / 1000))) }
            }
            let sentAt = Int64(Date().timeIntervalSince1970 * 1e6)
            let payload =
                #"{"aps":{"alert":{"title":"Benchmark","body":"A notification of a realistic size"},"badge":1}"#
                + (stamped ? ",\"sent_at_us\":\(sentAt)}" : "}")
            let targets: String
            if usersPerJob > 0 {
                let numbers = (0..<usersPerJob).map { index in
                    rotatedUsers.map { (job * usersPerJob + index) % $0 } ?? index
                }
                targets = "\"users\": [" + numbers.map { "\"\(userPrefix)\($0)\"" }.joined(separator: ",") + "]"
            } else {
                targets =
                    "\"tokens\": ["
                    + (0..<tokensPerJob).map { "\"" + String(format: "%064x", job * tokensPerJob + $0 + 1) + "\"" }
                    .joined(separator: ",") + "]"
            }
            let topic = topics.isEmpty ? "" : "\"topic\": \"\(topics[job % topics.count])\", "
            last = try connection.publish(
                to: queue,
                body: Array(
                    "{\"id\": \"bench-\(job)\", \(topic)\(environment)\(targets), \"payload\": \(payload)}".utf8),
                properties: AMQPProperties(timestamp: sentAt / 1_000_000))
            if (job - first) % 500 == 499 || rate != nil && (job - first) % 20 == 19 {
                _ = try connection.waitForConfirms(through: last)
            }
        }
        _ = try connection.waitForConfirms(through: last)
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9
        print(
            String(
                format: "fill: %d jobs on %@ in %.3f s = %.0f msg/s (persistent, confirmed every 500)",
                jobs, queue, seconds, Double(jobs) / seconds))
    } catch { fail("\(error)") }
case "drain":
    guard let url = options["amqp"], let queue = options["queue"] else { fail("drain needs --amqp and --queue") }
    let count = integer("count", 10_000)
    let ackEvery = max(1, integer("ack-every", 1))
    let prefetch = integer("prefetch", 500)
    // An ack that stays as many messages behind as the broker may have unacknowledged would wait forever.
    let ackLag = integer("ack-lag", 0, minimum: 0)
    guard ackLag < prefetch else { fail("--ack-lag \(ackLag) must be below --prefetch \(prefetch)") }
    let multiple = ackEvery > 1 || ackLag > 0
    do {
        let connection = try AMQPNodes(url).connect(startingAt: 0)
        try connection.setPrefetch(prefetch)
        try connection.consume(queue)
        var received = 0
        var started: DispatchTime?
        while received < count {
            guard let event = try connection.nextEvent(timeout: 30) else {
                fail("no message for 30 s after \(received)")
            }
            if case .delivery(let delivery) = event {
                if started == nil { started = .now() }
                received += 1
                // --ack-every 1: one ack per message, the simplest consumer; 100: one multiple ack per 100 messages,
                // the broker's best case. The last message settles everything.
                if received == count {
                    try connection.ack(delivery.deliveryTag, multiple: multiple)
                } else if received % ackEvery == 0 && delivery.deliveryTag > UInt64(ackLag) {
                    try connection.ack(delivery.deliveryTag - UInt64(ackLag), multiple: multiple)
                }
            }
        }
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - started!.uptimeNanoseconds) / 1e9
        print(String(format: "drain: %d messages in %.3f s = %.0f msg/s", count, seconds, Double(count) / seconds))
    } catch { fail("\(error)") }
case "wait":
    guard let url = options["sim"] else { fail("wait needs --sim") }
    let count = integer("count", 10_000)
    let started = DispatchTime.now()
    // When apns-sim first answered more than it had at the first poll: what came before is the sender's start-up
    // (a worker's connections and handshakes), not its rate.
    var baseline: Int?
    var firstAnswer: (at: UInt64, received: Int)?
    var received = 0
    do {
        let endpoint = try APNsEndpoint(url: url)
        let client = try HTTP2Client(
            configuration: .init(
                host: endpoint.host, port: endpoint.port,
                tls: .init(caFile: options["ca"])),
            logger: Logger(label: "apns-bench", level: .error))
        defer { client.shutdown() }
        while true {
            let answer = Locked<Int>(-1)
            let done = DispatchSemaphore(value: 0)
            client.send(
                HTTP2Request(
                    headers: .request(method: "GET", authority: client.authority, path: "/sim/stats"), body: [])
            ) { result in
                if case .success(let response) = result,
                    let object = try? JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any],
                    let received = object["received"] as? Int
                {
                    answer.withLock { $0 = received }
                }
                done.signal()
            }
            done.wait()
            received = answer.withLock { $0 }
            if baseline == nil && received >= 0 { baseline = received }
            if firstAnswer == nil, let baseline, received > baseline {
                firstAnswer = (DispatchTime.now().uptimeNanoseconds, received)
            }
            if received >= count { break }
            usleep(20_000)  // a benchmark's sampling period, not synchronisation
        }
        let now = DispatchTime.now().uptimeNanoseconds
        let seconds = Double(now - started.uptimeNanoseconds) / 1e9
        // The rate from the first answer seen counts only the answers after it, as a consumer's rate counts from
        // its first message.
        let sinceFirst = firstAnswer.map { (seconds: Double(now - $0.at) / 1e9, answers: received - $0.received) }
        print(
            String(format: "wait: apns-sim reached %d answers in %.3f s", count, seconds)
                + (sinceFirst.map {
                    String(
                        format: " (%.3f s from the first answer seen, %d answers since: %.0f/s)", $0.seconds,
                        $0.answers, Double($0.answers) / $0.seconds)
                } ?? ""))
    } catch { fail("\(error)") }
default:
    fail("unknown mode \(mode)\n\(usage)")
}
