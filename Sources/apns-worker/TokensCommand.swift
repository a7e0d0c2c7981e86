import APNs
import Configuration
import Foundation
import Operations
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
    let device = parsed.value("--device")
    if action == "add", let device {
        guard case .object? = try? JSONReader.parse(Array(device.utf8)) else {
            fail("tokens add: --device must be a JSON object", code: ExitCode.usage)
        }
    }
    let configuration = parsed.configuration(requiringCredentials: false)
    let editor: TokenCacheEditor
    do {
        editor = try TokenCacheEditor(configuration: configuration, fullTokens: parsed.switches.contains("--full-tokens"),
                                      logger: Logger(label: "apns-worker", level: configuration.logLevel,
                                                     format: configuration.logFormat))
    } catch {
        failReaching("tokens", error)
    }
    do {
        switch action {
        case "add":
            print(try editor.add(user: user, token: operands[1],
                                 scope: TokenScope(environment: environment ?? .production, topic: topic),
                                 deviceJSON: device))
        case "remove":
            print(try editor.remove(user: user, token: operands[1], topic: topic, environment: environment))
        default:
            print(try editor.list(user: user, topic: topic, json: parsed.switches.contains("--json")))
        }
    } catch let refused as TokenCacheEditor.RefusedChange {
        fail("tokens \(action): \(refused)", code: ExitCode.dataError)
    } catch {
        failReaching("tokens \(action)", error)
    }
}
