import APNs
import Configuration
import Foundation
import JSON
import Operations
import Redis
import Telemetry
import WorkerPipeline

let tokensHelp = """
    apns-worker tokens: read and change the Redis token cache by hand (the schema is in docs/contract.md).

    USAGE: apns-worker tokens add USER TOKEN [--environment production|sandbox] [--topic TOPIC] [--device JSON]
                                    [--activity ID] [--timezone ZONE]
           apns-worker tokens remove USER TOKEN [--topic TOPIC] [--environment production|sandbox]
           apns-worker tokens list USER [--topic TOPIC] [--full-tokens] [--json]
           apns-worker tokens keys USER
           apns-worker tokens import [FILE]
           apns-worker tokens migrate --from redis://[:password@]host:port/db

      add       the token belongs to USER from now on (as a registration event would say): written with the time
                of registration, taken away from another user who had it; --device keeps metadata such as
                {"model":"iPhone15,2","os":"17.1","app_version":"4.2"}.
                --topic is the full APNs topic the token was issued for, for tokens other than the default app's
                device token: com.example.app.voip (PushKit VoIP), com.example.app.push-type.liveactivity (Live
                Activity push-to-start or update), com.example.other (another app). Without it the token is a device
                token of the default app (APNS_TOPIC), for alert and background pushes.
                --activity ID (with --topic <bundle>.push-type.liveactivity): a Live Activity's update token, kept
                under that activity for a day rather than among USER's tokens; a job with "activity": "ID" reaches it.
                --timezone ZONE: USER's time zone, an IANA name such as Europe/Paris (checked against the system's
                time zone database, tzdata): a job's "local_window" reaches USER only inside those hours of USER's day.
      remove    the token no longer receives USER's notifications; with --topic (and --environment) only if the
                cached token serves that topic (there), so a token of another kind is never removed by mistake
      list      USER's tokens: environment, topic, when last registered (and how many days ago), device metadata;
                --topic shows only the tokens a job with that topic reaches. Tokens are shortened (first 8
                characters and length) unless --full-tokens; --json for scripts.
      keys      USER's keys in Redis (tokens, registration times, devices, time zone, removals), a line each with
                where it lives: the Redis URL, or in a Redis Cluster the key's hash slot and the master that serves it
      import    registration events from FILE (standard input without it, or -), one JSON object per line as on
                PUSH_REGISTRATIONS_QUEUE ({"user": "u1", "token": "<hex>", "environment": "sandbox", "timestamp":
                1732900000000}); applied as the cleanup consumer applies them, 1,000 at a time: an event older than
                what the cache knows changes nothing, so a file imported again leaves the cache as it was (events
                without a timestamp count as registered now). Progress on standard error, counts at the end. Lines
                that are not an event are reported by number and skipped (exit 65 once the rest is in).
      migrate   copies the token cache of the single Redis --from names (tokens, registration times, devices,
                owners, time zones) into the configured Redis, usually a Redis Cluster (REDIS_CLUSTER_NODES),
                writing its key form; a page of users at a time, progress every two seconds, counts at the end. Nothing the
                destination knows a newer registration of is overwritten, so it can run again: after an interruption,
                or to catch up just before the workers switch over.

    Settings it reads (environment, --config file or --set):
    \(SettingTable.help(for: .tokens))

    EXAMPLES:
      apns-worker tokens add alice 3f0c9a...e1 --environment sandbox
      apns-worker tokens add alice 7d41e0...9b --topic com.example.app.voip
      apns-worker tokens add alice 3f0c9a...e1 --timezone America/New_York
      apns-worker tokens list alice
      apns-worker tokens import registrations.jsonl
      REDIS_CLUSTER_NODES=10.0.0.21:6379 apns-worker tokens migrate --from redis://10.0.0.5:6379/0

    EXIT CODES: 0 done, 2 bad command line or bad token, 65 (import) lines that are not an event, the rest
    applied, 69 Redis unreachable, 78 bad configuration.
    """

func tokensCommand(_ arguments: [String]) {
    let parsed = ParsedArguments.parse(
        arguments, command: "tokens",
        valued: [
            "--environment", "--device", "--topic", "--from", "--activity",
            "--timezone"
        ],
        switches: ["--full-tokens", "--json"], help: tokensHelp)
    guard let action = parsed.positionals.first else {
        fail(
            "tokens: say add, remove, list, keys, import or migrate; try 'apns-worker tokens --help'",
            code: ExitCode.usage)
    }
    let operands = Array(parsed.positionals.dropFirst())
    guard ["add", "remove", "list", "keys", "import", "migrate"].contains(action) else {
        fail("tokens: unknown action \(action) (add, remove, list, keys, import, migrate)", code: ExitCode.usage)
    }
    if action == "migrate" {
        guard operands.isEmpty, let from = parsed.value("--from") else {
            fail(
                "tokens migrate: wants --from redis://host:port/db; try 'apns-worker tokens --help'",
                code: ExitCode.usage)
        }
        migrateTokens(from: from, parsed)
    }
    if action == "import" {
        guard operands.count <= 1 else { fail("tokens import: wants at most one FILE", code: ExitCode.usage) }
        importTokens(from: operands.first ?? "-", parsed)
    }
    let options = TokenEditOptions(action: action, operands: operands, parsed)
    let editor = tokenCacheEditor(parsed, fullTokens: parsed.switches.contains("--full-tokens"), command: "tokens")
    do {
        switch action {
        case "add":
            print(
                try editor.add(
                    user: options.user, token: operands[1],
                    scope: TokenScope(environment: options.environment ?? .production, topic: options.topic),
                    deviceJSON: options.device, activity: options.activity, timeZone: options.timeZone))
        case "remove":
            print(
                try editor.remove(
                    user: options.user, token: operands[1], topic: options.topic, environment: options.environment))
        case "keys":
            print(editor.keys(user: options.user))
        default:
            print(try editor.list(user: options.user, topic: options.topic, json: parsed.switches.contains("--json")))
        }
    } catch let refused as TokenCacheEditor.RefusedChange {
        fail("tokens \(action): \(refused)", code: ExitCode.dataError)
    } catch {
        failReaching("tokens \(action)", error)
    }
}

/// What `tokens add|remove|list|keys` were given, each checked: a problem ends the command with a usage error that
/// names it.
private struct TokenEditOptions {
    var user: String
    var topic: String?
    var environment: APNsEnvironment?
    var device: String?
    var activity: String?
    var timeZone: String?

    init(action: String, operands: [String], _ parsed: ParsedArguments) {
        let wanted = action == "list" || action == "keys" ? 1 : 2
        guard operands.count == wanted else {
            fail(
                "tokens \(action): wants \(wanted == 1 ? "USER" : "USER TOKEN"); try 'apns-worker tokens --help'",
                code: ExitCode.usage)
        }
        user = operands[0]
        guard !user.isEmpty, user.utf8.count <= 256 else {
            fail("tokens: USER must be 1 to 256 bytes", code: ExitCode.usage)
        }
        if wanted == 2 {
            do throws(APNsRequestError) { try APNsNotification.validateDeviceToken(operands[1]) } catch {
                fail("tokens \(action): TOKEN: \(error)", code: ExitCode.usage)
            }
        }
        topic = parsed.value("--topic")
        if let topic, !TokenScope.isValidTopic(topic) {
            fail(
                "tokens \(action): --topic must be an APNs topic (a bundle ID with its push type's suffix, e.g. "
                    + "com.example.app.voip)", code: ExitCode.usage)
        }
        if let text = parsed.value("--environment") {
            guard let parsed = APNsEnvironment(rawValue: text) else {
                fail("tokens \(action): --environment must be production or sandbox, got \(text)", code: ExitCode.usage)
            }
            environment = parsed
        }
        device = parsed.value("--device")
        if action == "add", let device {
            guard case .object? = try? JSONReader.parse(Array(device.utf8)) else {
                fail("tokens add: --device must be a JSON object", code: ExitCode.usage)
            }
        }
        activity = parsed.value("--activity")
        if let activity { checkActivityOption(activity, action: action, topic: topic) }
        timeZone = parsed.value("--timezone")
        if let timeZone {
            guard action == "add" else { fail("tokens \(action): --timezone goes with add", code: ExitCode.usage) }
            guard activity == nil else {
                fail(
                    "tokens add: --timezone is a user's, not an activity's: give it without --activity",
                    code: ExitCode.usage)
            }
            if let problem = TimeZoneName.problem(timeZone) {
                fail("tokens add: --timezone: \(problem)", code: ExitCode.usage)
            }
        }
    }
}

/// The token cache's editor on the configured Redis; a Redis out of reach ends `command` with its exit code.
private func tokenCacheEditor(_ parsed: ParsedArguments, fullTokens: Bool, command: String) -> TokenCacheEditor {
    let configuration = parsed.configuration(requiringCredentials: false)
    do {
        return try TokenCacheEditor(
            configuration: configuration, fullTokens: fullTokens,
            logger: Logger(label: "apns-worker", level: configuration.logLevel, format: configuration.logFormat))
    } catch {
        failReaching(command, error)
    }
}

/// `tokens import`: progress every two seconds on standard error, the counts at the end.
private func importTokens(from path: String, _ parsed: ParsedArguments) -> Never {
    let editor = tokenCacheEditor(parsed, fullTokens: false, command: "tokens import")
    let started = Date()
    var lastShown = started
    let report: TokenCacheEditor.ImportReport
    do {
        report = try editor.importRegistrations(path: path) { report in
            guard Date().timeIntervalSince(lastShown) >= 2 else { return }
            lastShown = Date()
            let share =
                report.totalBytes.map { total in
                    String(format: " (%.0f%% of the file)", 100 * Double(report.bytesRead) / Double(max(1, total)))
                } ?? ""
            FileHandle.standardError.write(
                Data("tokens import: \(report.lines) lines, \(report.applied) applied\(share)\n".utf8))
        }
    } catch let unreadable as JobReaderError {
        fail("tokens import: \(unreadable)", code: ExitCode.usage)
    } catch {
        failReaching("tokens import", error)
    }
    for refusal in report.firstRefusals { FileHandle.standardError.write(Data("tokens import: \(refusal)\n".utf8)) }
    print(
        String(
            format: "imported %d lines in %.1f s: %d applied, %d unchanged (the cache knew a newer registration), "
                + "%d refused", report.lines, Date().timeIntervalSince(started), report.applied, report.unchanged,
            report.refused))
    exit(report.refused == 0 ? ExitCode.success : ExitCode.dataError)
}

/// `tokens migrate`: progress every two seconds on standard error, the counts at the end.
private func migrateTokens(from text: String, _ parsed: ParsedArguments) -> Never {
    let source: RedisURL
    do throws(RedisError) { source = try RedisURL(text) } catch {
        fail("tokens migrate: --from: \(error.message)", code: ExitCode.usage)
    }
    let configuration = parsed.configuration(requiringCredentials: false)
    let logger = Logger(label: "apns-worker", level: configuration.logLevel, format: configuration.logFormat)
    let started = Date()
    var lastShown = started
    let done: TokenMigration.Progress
    do {
        let migration = try TokenMigration(from: source, to: configuration.redis, logger: logger)
        done = try migration.run { progress in
            guard Date().timeIntervalSince(lastShown) >= 2 else { return }
            lastShown = Date()
            FileHandle.standardError.write(
                Data("tokens migrate: \(progress.users) users, \(progress.tokens) tokens read\n".utf8))
        }
    } catch {
        if error.kind == .badURL { fail("tokens migrate: \(error.message)", code: ExitCode.usage) }
        failReaching("tokens migrate", error)
    }
    print(
        String(
            format: "migrated %d users in %.1f s from %@ to %@: %d tokens read, %d written, %d kept (the destination "
                + "knew a newer registration), %d users unreadable at the source", done.users,
            Date().timeIntervalSince(started), source.description, configuration.redis.description, done.tokens,
            done.written, done.kept, done.unreadableUsers))
    exit(ExitCode.success)
}

/// `--activity ID`: with `add` only, an activity id (`LiveActivityID`), beside a Live Activity topic (an update
/// token's); else exit 2.
private func checkActivityOption(_ activity: String, action: String, topic: String?) {
    guard action == "add" else { fail("tokens \(action): --activity goes with add", code: ExitCode.usage) }
    guard LiveActivityID.isValid(activity) else {
        fail("tokens add: --activity must be \(LiveActivityID.rule)", code: ExitCode.usage)
    }
    guard topic?.hasSuffix(APNsPushType.liveactivity.topicSuffix) == true else {
        fail(
            "tokens add: --activity wants --topic <bundle>.push-type.liveactivity (an update token's topic)",
            code: ExitCode.usage)
    }
}
