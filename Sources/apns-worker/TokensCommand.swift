import APNs
import Foundation
import Redis
import Telemetry
import WorkerPipeline

let tokensHelp = """
apns-worker tokens: read and change the Redis token cache by hand (the schema is in README.md).

USAGE: apns-worker tokens add USER TOKEN [--environment production|sandbox] [--device JSON]
       apns-worker tokens remove USER TOKEN
       apns-worker tokens list USER [--full-tokens] [--json]

  add       the token belongs to USER from now on (as a registration event would say): written with the time
            of registration, taken away from another user who had it; --device keeps metadata such as
            {"model":"iPhone15,2","os":"17.1","app_version":"4.2"}
  remove    the token no longer receives USER's notifications
  list      USER's tokens: environment, when last registered (and how many days ago), device metadata.
            Tokens are shortened (first 8 characters and length) unless --full-tokens; --json for scripts.

EXAMPLES:
  apns-worker tokens add alice 3f0c9a...e1 --environment sandbox
  apns-worker tokens list alice

EXIT CODES: 0 done, 2 bad command line or bad token, 69 Redis unreachable, 78 bad configuration.
"""

func tokensCommand(_ arguments: [String]) {
    let parsed = ParsedArguments.parse(arguments, command: "tokens", valued: ["--environment", "--device"],
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
    let configuration = parsed.configuration(requiringCredentials: false)
    let logger = Logger(label: "apns-worker", level: configuration.logLevel, format: configuration.logFormat)
    let cache: TokenCache
    do { cache = TokenCache(redis: try RedisConnection(url: configuration.redisURL), logger: logger) } catch {
        fail("tokens: \(error)", code: ExitCode.unavailable)
    }
    let full = parsed.switches.contains("--full-tokens")
    do {
        switch action {
        case "add":
            let environmentText = parsed.value("--environment") ?? "production"
            guard let environment = APNsEnvironment(rawValue: environmentText) else {
                fail("tokens add: --environment must be production or sandbox, got \(environmentText)", code: ExitCode.usage)
            }
            let device = parsed.value("--device")
            if let device {
                guard case .object? = try? JSONReader.parse(Array(device.utf8)) else {
                    fail("tokens add: --device must be a JSON object", code: ExitCode.usage)
                }
            }
            let now = Int64(Date().timeIntervalSince1970 * 1000)
            try cache.register([TokenRegistration(user: user, token: operands[1], environment: environment,
                                                  registeredAt: now, deviceJSON: device)])
            print("added \(shown(operands[1], full: full)) for \(user) (\(environment.rawValue))")
        case "remove":
            let removed = try cache.remove([(user: user, token: operands[1], unlessRegisteredAfter: nil)])
            print(removed.first == true ? "removed \(shown(operands[1], full: full)) from \(user)"
                                        : "\(user) had no token \(shown(operands[1], full: full))")
        default:
            let entries = try cache.entries(forUser: user)
            print(parsed.switches.contains("--json") ? listJSON(entries, full: full) : listText(entries, user: user, full: full))
        }
    } catch {
        fail("tokens \(action): \(error)", code: ExitCode.unavailable)
    }
}

private func listText(_ entries: [TokenEntry], user: String, full: Bool) -> String {
    guard !entries.isEmpty else { return "\(user) has no tokens" }
    let now = Date()
    var lines = ["TOKEN\(String(repeating: " ", count: full ? 60 : 15))ENVIRONMENT  LAST REGISTERED (UTC)      DEVICE"]
    let formatter = ISO8601DateFormatter()
    for entry in entries {
        var registered = "unknown"
        if let at = entry.registeredAt {
            let date = Date(timeIntervalSince1970: Double(at) / 1000)
            registered = formatter.string(from: date) + " (\(Int(now.timeIntervalSince(date) / 86_400)) d)"
        }
        lines.append(shown(entry.token, full: full).padding(toLength: full ? 65 : 20, withPad: " ", startingAt: 0)
                     + entry.environment.padding(toLength: 13, withPad: " ", startingAt: 0)
                     + registered.padding(toLength: 27, withPad: " ", startingAt: 0) + (entry.deviceJSON ?? ""))
    }
    return lines.joined(separator: "\n")
}

private func listJSON(_ entries: [TokenEntry], full: Bool) -> String {
    "[" + entries.map { entry in
        "{\"token\":\(JSONString.quote(shown(entry.token, full: full))),\"environment\":\(JSONString.quote(entry.environment)),"
            + "\"registered_at\":\(entry.registeredAt.map(String.init) ?? "null"),\"device\":\(entry.deviceJSON ?? "null")}"
    }.joined(separator: ",") + "]"
}
