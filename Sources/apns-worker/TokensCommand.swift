import APNs
import Configuration
import Foundation
import Redis
import RedisStore
import Telemetry
import WorkerPipeline

let tokensHelp = """
apns-worker tokens: read and change the Redis token cache by hand (the schema is in README.md).

USAGE: apns-worker tokens add USER TOKEN [--environment production|sandbox] [--topic TOPIC] [--device JSON]
       apns-worker tokens remove USER TOKEN [--topic TOPIC] [--environment production|sandbox]
       apns-worker tokens list USER [--topic TOPIC] [--full-tokens] [--json]

  add       the token belongs to USER from now on (as a registration event would say): written with the time
            of registration, taken away from another user who had it; --device keeps metadata such as
            {"model":"iPhone15,2","os":"17.1","app_version":"4.2"}.
            --topic is the full APNs topic the token was issued for, for tokens other than the default app's
            device token: com.example.app.voip (PushKit VoIP), com.example.app.push-type.liveactivity (Live
            Activity push-to-start or update), com.example.other (another app). Without it the token is a device
            token of the default app (APNS_TOPIC), for alert and background pushes.
  remove    the token no longer receives USER's notifications; with --topic (and --environment) only if the
            cached token serves that topic (there), so a token of another kind is never removed by mistake
  list      USER's tokens: environment, topic, when last registered (and how many days ago), device metadata;
            --topic shows only the tokens a job with that topic reaches. Tokens are shortened (first 8
            characters and length) unless --full-tokens; --json for scripts.

Settings it reads (environment, --config file or --set):
\(SettingTable.help(for: .tokens))

EXAMPLES:
  apns-worker tokens add alice 3f0c9a...e1 --environment sandbox
  apns-worker tokens add alice 7d41e0...9b --topic com.example.app.voip
  apns-worker tokens list alice

EXIT CODES: 0 done, 2 bad command line or bad token, 69 Redis unreachable, 78 bad configuration.
"""

func tokensCommand(_ arguments: [String]) {
    let parsed = ParsedArguments.parse(arguments, command: "tokens", valued: ["--environment", "--device", "--topic"],
                                       switches: ["--full-tokens", "--json"], help: tokensHelp)
    guard let action = parsed.positionals.first else {
        fail("tokens: say add, remove or list; try 'apns-worker tokens --help'", code: ExitCode.usage)
    }
    let operands = Array(parsed.positionals.dropFirst())
    let wanted = action == "list" ? 1 : 2
    guard ["add", "remove", "list"].contains(action) else {
        fail("tokens: unknown action \(action) (add, remove, list)", code: ExitCode.usage)
    }
    guard operands.count == wanted else {
        fail("tokens \(action): wants \(action == "list" ? "USER" : "USER TOKEN"); try 'apns-worker tokens --help'",
             code: ExitCode.usage)
    }
    let user = operands[0]
    guard !user.isEmpty, user.utf8.count <= 256 else { fail("tokens: USER must be 1 to 256 bytes", code: ExitCode.usage) }
    if wanted == 2 {
        do throws(APNsRequestError) { try APNsNotification.validateDeviceToken(operands[1]) } catch {
            fail("tokens \(action): TOKEN: \(error)", code: ExitCode.usage)
        }
    }
    let topic = parsed.value("--topic")
    if let topic, !TokenScope.isValidTopic(topic) {
        fail("tokens \(action): --topic must be an APNs topic (1 to 255 visible ASCII characters, e.g. "
             + "com.example.app.voip)", code: ExitCode.usage)
    }
    var environment: APNsEnvironment?
    if let text = parsed.value("--environment") {
        guard let parsed = APNsEnvironment(rawValue: text) else {
            fail("tokens \(action): --environment must be production or sandbox, got \(text)", code: ExitCode.usage)
        }
        environment = parsed
    }
    let configuration = parsed.configuration(requiringCredentials: false)
    let logger = Logger(label: "apns-worker", level: configuration.logLevel, format: configuration.logFormat)
    let cache: TokenCache
    do { cache = TokenCache(redis: try RedisConnection(url: configuration.redisURL), logger: logger) } catch {
        failReaching("tokens: \(error)", error)
    }
    let full = parsed.switches.contains("--full-tokens")
    do {
        switch action {
        case "add":
            let scope = TokenScope(environment: environment ?? .production, topic: topic)
            let device = parsed.value("--device")
            if let device {
                guard case .object? = try? JSONReader.parse(Array(device.utf8)) else {
                    fail("tokens add: --device must be a JSON object", code: ExitCode.usage)
                }
            }
            let now = Int64(Date().timeIntervalSince1970 * 1000)
            let change = try cache.register([TokenRegistration(user: user, token: operands[1], scope: scope,
                                                               registeredAt: now, deviceJSON: device)])
            if case .failed(let message)? = change.first {
                fail("tokens add: Redis refused the change (another system wrote these keys?): \(message)",
                     code: ExitCode.dataError)
            }
            print("added \(shown(operands[1], full: full)) for \(user) (\(scope.cacheValue))")
        case "remove":
            var servedValues: [String]?
            if let topic {
                let matcher = TopicMatcher(topic: topic, defaultTopic: configuration.credential.defaultTopic)
                servedValues = (environment.map { [$0] } ?? APNsEnvironment.allCases).flatMap(matcher.cacheValues(in:))
            } else if let environment {
                servedValues = [environment.rawValue]
            }
            let removed = try cache.remove([TokenRemoval(user: user, token: operands[1], onlyIfValueIn: servedValues)])
            if case .failed(let message)? = removed.first {
                fail("tokens remove: Redis refused the change (another system wrote these keys?): \(message)",
                     code: ExitCode.dataError)
            }
            if removed.first == .applied {
                print("removed \(shown(operands[1], full: full)) from \(user)")
            } else if servedValues != nil, let entry = try cache.entries(forUser: user).first(where: { $0.token == operands[1] }) {
                print("\(user)'s token \(shown(operands[1], full: full)) serves \(entry.value), not "
                      + "\(topic ?? "the default app") in \(environment.map(\.rawValue) ?? "either environment"): kept")
            } else {
                print("\(user) had no token \(shown(operands[1], full: full))")
            }
        default:
            var entries = try cache.entries(forUser: user)
            if let topic {
                let matcher = TopicMatcher(topic: topic, defaultTopic: configuration.credential.defaultTopic)
                entries.removeAll { entry in !(entry.scope.map(matcher.serves) ?? false) }
            }
            print(parsed.switches.contains("--json") ? listJSON(entries, full: full)
                  : listText(entries, user: user, full: full, defaultTopic: configuration.credential.defaultTopic))
        }
    } catch {
        failReaching("tokens \(action): \(error)", error)
    }
}

private func listText(_ entries: [TokenEntry], user: String, full: Bool, defaultTopic: String?) -> String {
    guard !entries.isEmpty else { return "\(user) has no tokens" }
    let now = Date()
    let topics = entries.map { entry -> String in
        guard let scope = entry.scope else { return "(unreadable: \(entry.value.prefix(40)))" }
        return scope.topic ?? (defaultTopic.map { "\($0) (default app)" } ?? "(default app)")
    }
    let topicWidth = max(6, topics.map(\.count).max() ?? 0) + 2
    var lines = ["TOKEN".padding(toLength: full ? 65 : 20, withPad: " ", startingAt: 0) + "ENVIRONMENT  "
                 + "TOPIC".padding(toLength: topicWidth, withPad: " ", startingAt: 0) + "LAST REGISTERED (UTC)      DEVICE"]
    let formatter = ISO8601DateFormatter()
    for (entry, topic) in zip(entries, topics) {
        var registered = "unknown"
        if let at = entry.registeredAt {
            let date = Date(timeIntervalSince1970: Double(at) / 1000)
            registered = formatter.string(from: date) + " (\(Int(now.timeIntervalSince(date) / 86_400)) d)"
        }
        let environment = entry.scope?.environment.rawValue ?? "-"
        lines.append(shown(entry.token, full: full).padding(toLength: full ? 65 : 20, withPad: " ", startingAt: 0)
                     + environment.padding(toLength: 13, withPad: " ", startingAt: 0)
                     + topic.padding(toLength: topicWidth, withPad: " ", startingAt: 0)
                     + registered.padding(toLength: 27, withPad: " ", startingAt: 0) + (entry.deviceJSON ?? ""))
    }
    return lines.joined(separator: "\n")
}

/// `topic` is null for a device token of the default app; `value` is the cache value as stored.
private func listJSON(_ entries: [TokenEntry], full: Bool) -> String {
    "[" + entries.map { entry in
        "{\"token\":\(JSONString.quote(shown(entry.token, full: full))),"
            + "\"environment\":\(entry.scope.map { JSONString.quote($0.environment.rawValue) } ?? "null"),"
            + "\"topic\":\(entry.scope?.topic.map(JSONString.quote) ?? "null"),\"value\":\(JSONString.quote(entry.value)),"
            + "\"registered_at\":\(entry.registeredAt.map(String.init) ?? "null"),\"device\":\(entry.deviceJSON ?? "null")}"
    }.joined(separator: ",") + "]"
}
