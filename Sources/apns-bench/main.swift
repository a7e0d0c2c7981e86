import APNs
import Foundation
import Synchronization
import Telemetry

let usage = """
apns-bench: load generators for scripts/bench (figures, never pass/fail).

USAGE:
  apns-bench client --url URL [--ca FILE] [--connections C] [--streams M] [--requests N]
                    [--key FILE --key-id KID --team-id TEAM] [--token HEX] [--topic TOPIC]
      Sends N notifications through the project's APNs client with C connections, keeping C*M in flight
      (like `h2load -c C -m M -n N`), and prints one line: requests, seconds, requests per second, statuses.
  apns-bench jwt --key FILE --key-id KID --team-id TEAM
      Prints an authorization header value (bearer JWT) for other load tools.
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
    let progress = Mutex(Progress())
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
        client.send(Array(repeating: (.production, notification), count: count)) { [self] _, result in
            let next = progress.withLock { state -> Int in
                state.completed += 1
                state.statuses[result.response?.status ?? -1, default: 0] += 1
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
nonisolated(unsafe) var options: [String: String] = [:]  // written once, before any other thread starts
while !arguments.isEmpty {
    let flag = arguments.removeFirst()
    if flag == "-h" || flag == "--help" { print(usage); exit(0) }
    guard flag.hasPrefix("--"), !arguments.isEmpty else { fail("bad option \(flag)") }
    options[String(flag.dropFirst(2))] = arguments.removeFirst()
}
func integer(_ name: String, _ fallback: Int) -> Int {
    guard let text = options[name] else { return fallback }
    guard let value = Int(text), value > 0 else { fail("--\(name) \(text) is not a positive number") }
    return value
}

func tokenProvider() -> APNsTokenProvider? {
    guard let keyFile = options["key"] else { return nil }
    do {
        return try APNsTokenProvider(key: try ES256Key(contentsOfFile: keyFile), keyID: options["key-id"] ?? "",
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
    let authentication: APNsAuthentication = tokenProvider().map { .token($0) }
        ?? .certificate(certificateFile: "", privateKeyFile: nil)
    if case .certificate = authentication { fail("client needs --key, --key-id and --team-id") }
    let client = APNsClient(configuration: .init(production: endpoint, caFile: options["ca"],
                                                 connectionsPerEnvironment: connections),
                            authentication: authentication, logger: Logger(label: "apns-bench", level: .error))
    let notification = APNsNotification(
        deviceToken: options["token"] ?? String(repeating: "ab", count: 32),
        topic: options["topic"] ?? "com.example.app",
        payload: Array(#"{"aps":{"alert":{"title":"Benchmark","body":"A notification of a realistic size"},"badge":1}}"#.utf8))

    // Warm-up: open every connection before the clock starts, as h2load does before its first request.
    let warm = DispatchSemaphore(value: 0)
    client.send(Array(repeating: (.production, notification), count: connections * 2)) { _, _ in warm.signal() }
    for _ in 0..<(connections * 2) { warm.wait() }

    let window = connections * streams
    let driver = Driver(client: client, notification: notification, total: total, window: window,
                        refill: max(1, window / 4))
    let started = DispatchTime.now().uptimeNanoseconds
    driver.start()
    driver.done.wait()
    let seconds = Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9
    let statuses = driver.statuses
    let statusText = statuses.keys.sorted().map { "\($0)=\(statuses[$0]!)" }.joined(separator: " ")
    print(String(format: "client: %d requests in %.3f s = %.0f req/s, connections=%d streams=%d, statuses %@",
                 total, seconds, Double(total) / seconds, connections, streams, statusText))
    client.shutdown()
default:
    fail("unknown mode \(mode)\n\(usage)")
}
