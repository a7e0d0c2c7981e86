import APNs
import Configuration
import Foundation
import JSON
import Operations
import Telemetry

let channelsHelp = """
    apns-worker channels: the broadcast channels of an app (iOS 18 Live Activities), through Apple's channel management
    API. A channel reaches every device whose Live Activity subscribed to it; a job with "channel_id" broadcasts on it.

    USAGE: apns-worker channels create [--topic BUNDLE] [--storage none|most-recent] [--environment production|sandbox] [--json]
           apns-worker channels list [--topic BUNDLE] [--environment ...] [--json]
           apns-worker channels show ID [--topic BUNDLE] [--environment ...] [--json]
           apns-worker channels delete ID [--topic BUNDLE] [--environment ...] [--json]

      create    a new channel of the app; prints its id (give it to the apps, e.g. as a Live Activity start's
                "input_push_channel"). --storage none (the default) delivers each broadcast to the devices online
                now, and a broadcast then must not expire later than 0; most-recent keeps the latest one up to 8 hours
                for devices that come back. The policy cannot change later.
      list      every channel id of the app, one a line
      show      the channel's storage policy (exit 65 if APNs does not know it for this app)
      delete    deletes the channel for good (devices subscribed to it get no more broadcasts)

      --topic is the app's bundle id (default APNS_TOPIC); the credential that serves it signs the requests
      (APNS_CREDENTIALS_FILE, or the single-key settings). --environment picks the channel management host
      (APNS_CHANNELS_PRODUCTION_URL or APNS_CHANNELS_SANDBOX_URL): channels are not shared between environments.
      --json prints one JSON object for scripts.

    Settings it reads (environment, --config file or --set):
    \(SettingTable.help(for: .channels))

    EXAMPLES:
      apns-worker channels create --topic com.example.scores --storage most-recent
      apns-worker channels list --topic com.example.scores --json
      apns-worker channels delete dHJhY2tpbmcgY2hhbm5lbA== --topic com.example.scores

    EXIT CODES: 0 done, 2 bad command line, 65 APNs refused the request (an unknown channel, the channel limit, a
    topic no credential serves), 69 APNs unreachable or busy (try again), 78 bad configuration.
    """

func channelsCommand(_ arguments: [String]) {
    let parsed = ParsedArguments.parse(
        arguments, command: "channels", valued: ["--topic", "--storage", "--environment"],
        switches: ["--json"], help: channelsHelp)
    guard let action = parsed.positionals.first else {
        fail("channels: say create, list, show or delete; try 'apns-worker channels --help'", code: ExitCode.usage)
    }
    let needsID = action == "show" || action == "delete"
    guard ["create", "list", "show", "delete"].contains(action) else {
        fail("channels: unknown action \(action); try 'apns-worker channels --help'", code: ExitCode.usage)
    }
    guard parsed.positionals.count == (needsID ? 2 : 1) else {
        fail("channels \(action): " + (needsID ? "give one channel ID" : "takes no argument"), code: ExitCode.usage)
    }
    let environment = channelEnvironment(parsed)
    let storage = channelStorage(parsed, action: action)
    let id = needsID ? parsed.positionals[1] : ""
    let channels = channelOperations(parsed, environment: environment)
    if needsID {
        do throws(APNsRequestError) { try APNsChannelID.check(id) } catch {
            fail("channels \(action): \(error)", code: ExitCode.usage)
        }
    }
    let bundle = channels.bundle
    let json = parsed.switches.contains("--json")
    do throws(APNsChannelError) {
        switch action {
        case "create":
            let created = try channels.create(storage: storage)
            print(
                json
                    ? channelJSON([
                        "channel_id": created, "topic": bundle, "storage": storage.name,
                        "environment": environment.rawValue
                    ]) : created)
        case "list":
            for line in channelList(try channels.list(), bundle: bundle, environment: environment, json: json) {
                print(line)
            }
        case "show":
            let policy = try channels.show(id)
            print(
                json
                    ? channelJSON([
                        "channel_id": id, "topic": bundle, "storage": policy.name,
                        "environment": environment.rawValue
                    ])
                    : "\(id): \(bundle), \(environment.rawValue), storage \(policy.name)")
        default:
            try channels.delete(id)
            print(json ? channelJSON(["channel_id": id, "topic": bundle, "deleted": "true"]) : "deleted \(id)")
        }
    } catch {
        fail("channels \(action): \(error)", code: error.isTransient ? ExitCode.unavailable : ExitCode.dataError)
    }
}

/// `channels list`'s lines: one ID a line, or with --json one line of the app, the environment and the IDs.
private func channelList(_ ids: [String], bundle: String, environment: APNsEnvironment, json: Bool) -> [String] {
    guard json else { return ids }
    return [
        "{\"topic\":\(JSONString.quote(bundle)),\"environment\":\"\(environment.rawValue)\","
            + "\"channels\":[\(ids.map(JSONString.quote).joined(separator: ","))]}"
    ]
}

/// --environment, production when not given.
private func channelEnvironment(_ parsed: ParsedArguments) -> APNsEnvironment {
    guard let text = parsed.value("--environment") else { return .production }
    guard let environment = APNsEnvironment(rawValue: text) else {
        fail("channels: --environment is production or sandbox, not \(text)", code: ExitCode.usage)
    }
    return environment
}

/// --storage, which only `create` takes; none when not given.
private func channelStorage(_ parsed: ParsedArguments, action: String) -> APNsChannelStorage {
    guard let text = parsed.value("--storage") else { return .none }
    guard action == "create" else { fail("channels \(action): --storage goes with create", code: ExitCode.usage) }
    guard let storage = APNsChannelStorage(name: text) else {
        fail("channels: --storage is none or most-recent, not \(text)", code: ExitCode.usage)
    }
    return storage
}

/// The channel management API of --topic's app (APNS_TOPIC's when not given), through the credential that serves it.
private func channelOperations(_ parsed: ParsedArguments, environment: APNsEnvironment) -> ChannelOperations {
    let configuration = parsed.configuration(requiringCredentials: true)
    guard let topic = parsed.value("--topic") ?? configuration.credential.defaultTopic else {
        fail("channels: give --topic (the app's bundle id) or set APNS_TOPIC", code: ExitCode.usage)
    }
    // A one-shot command: its connection's comings and goings are noise unless asked for (LOG_LEVEL=debug).
    let level = configuration.logLevel <= .debug ? configuration.logLevel : max(configuration.logLevel, .warning)
    let logger = Logger(label: "apns-worker", level: level, format: configuration.logFormat)
    do {
        return try ChannelOperations(
            configuration: configuration, topic: topic, environment: environment, logger: logger)
    } catch {
        switch error {
        case .configuration: fail("\(error)", code: ExitCode.configuration)
        case .noCredential: fail("channels: \(error)", code: ExitCode.dataError)
        }
    }
}

/// One flat JSON object of strings (and `true`).
private func channelJSON(_ fields: KeyValuePairs<String, String>) -> String {
    "{"
        + fields.map { "\(JSONString.quote($0.key)):" + ($0.value == "true" ? "true" : JSONString.quote($0.value)) }
        .joined(separator: ",") + "}"
}
