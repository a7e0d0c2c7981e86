import Configuration
import Foundation
import Synchronization
import Telemetry
import WorkerPipeline

/// Exit codes, the same for every subcommand (listed in `apns-worker --help`).
enum ExitCode {
    static let success: Int32 = 0
    /// A second signal cut the drain short.
    static let interrupted: Int32 = 1
    static let usage: Int32 = 2
    /// Some input was refused (enqueue: jobs that failed the checks; nothing was published for them).
    static let dataError: Int32 = 65
    /// The broker or Redis could not be reached, or failed during the command.
    static let unavailable: Int32 = 69
    static let configuration: Int32 = 78
}

func fail(_ message: String, code: Int32) -> Never {
    FileHandle.standardError.write(Data("apns-worker: \(message)\n".utf8))
    exit(code)
}

/// The broker or Redis failed a command: exit 78 naming the setting to fix if it refused what the settings say
/// (credentials, vhost, database, a master's name), 69 if it could not be reached or broke off (try again later).
func failReaching(_ command: String, _ error: any Error) -> Never {
    if let permanent = StartupError(permanent: error) {
        fail("\(command): configuration error: \(permanent)", code: ExitCode.configuration)
    }
    fail("\(command): \(error)", code: ExitCode.unavailable)
}

/// One subcommand's arguments: options with values (repeatable), switches, and the words left over.
struct ParsedArguments {
    var values: [String: [String]] = [:]
    var switches: Set<String> = []
    var positionals: [String] = []
    /// Settings from `--set` and the options that stand for a setting (`--log-level`).
    var settings: [String: String] = [:]
    var configFile: String?

    func value(_ option: String) -> String? { values[option]?.last }
    func all(_ option: String) -> [String] { values[option] ?? [] }

    /// Parses `arguments` for `command`: `valued` options take the next word (or `--option=value`); `--config`,
    /// `--set` and `--log-level` are understood everywhere. `--help` prints `help` and exits 0.
    static func parse(
        _ arguments: [String], command: String, valued: Set<String>, switches allowed: Set<String>,
        help: String
    ) -> ParsedArguments {
        var parsed = ParsedArguments()
        var rest = arguments[...]
        while let argument = rest.popFirst() {
            if argument == "-h" || argument == "--help" {
                print(help)
                exit(ExitCode.success)
            }
            guard argument.hasPrefix("--"), argument.count > 2 else {
                parsed.positionals.append(argument)
                continue
            }
            var name = argument
            var inline: String?
            if let equals = argument.firstIndex(of: "=") {
                name = String(argument[..<equals])
                inline = String(argument[argument.index(after: equals)...])
            }
            if allowed.contains(name) && inline == nil {
                parsed.switches.insert(name)
                continue
            }
            guard valued.contains(name) || ["--config", "--set", "--log-level"].contains(name) else {
                fail("\(command): unknown option \(name); try 'apns-worker \(command) --help'", code: ExitCode.usage)
            }
            guard let value = inline ?? rest.popFirst() else {
                fail("\(command): \(name) needs a value; try 'apns-worker \(command) --help'", code: ExitCode.usage)
            }
            switch name {
            case "--config": parsed.configFile = value
            case "--log-level": parsed.settings[SettingTable().logLevel.name] = value
            case "--set":
                guard let equals = value.firstIndex(of: "="), equals != value.startIndex else {
                    fail("--set wants KEY=VALUE, got \(value)", code: ExitCode.usage)
                }
                parsed.settings[String(value[..<equals])] = String(value[value.index(after: equals)...])
            default: parsed.values[name, default: []].append(value)
            }
        }
        return parsed
    }

    /// The configuration from the file, the environment and the flags, or exit 78 naming the key. A key the file or
    /// `--set` gives that no setting has is an error (a typo would otherwise run with the default); one in the
    /// environment with a prefix of ours is a warning (the environment holds much else).
    func configuration(requiringCredentials: Bool) -> WorkerConfiguration {
        let environment = ProcessInfo.processInfo.environment
        let configuration: WorkerConfiguration
        do { configuration = try loadConfiguration(requiringCredentials: requiringCredentials) } catch {
            fail("configuration error: \(error)", code: ExitCode.configuration)
        }
        let logger = Logger(label: "apns-worker", level: configuration.logLevel, format: configuration.logFormat)
        for warning in SettingKeys.unknownInEnvironment(environment) {
            logger.warning("unknown setting", ["setting": warning])
        }
        return configuration
    }

    /// The configuration from the file, the environment and the flags; the first problem throws.
    func loadConfiguration(requiringCredentials: Bool) throws(ConfigurationError) -> WorkerConfiguration {
        let file =
            try configFile.map { path throws(ConfigurationError) in try ConfigurationSources.readFile(path) } ?? [:]
        if let configFile { try SettingKeys.checkKnown(file.keys, source: "in \(configFile)") }
        try SettingKeys.checkKnown(settings.keys, source: "given with --set")
        return try WorkerConfiguration.load(
            from: ConfigurationSources.merge(
                file: file, environment: ProcessInfo.processInfo.environment, flags: settings),
            requiringCredentials: requiringCredentials)
    }

    /// An option that must be a whole number in `range`, or exit 2 naming it.
    func integer(_ option: String, default fallback: Int, range: ClosedRange<Int>, command: String) -> Int {
        number(option, range: range, command: command, kind: "a whole number", read: { Int($0) }) ?? fallback
    }

    /// An option that must be a number of seconds in `range` (finite: "inf" and "nan" are numbers to `Double`), or
    /// exit 2 naming it.
    func seconds(_ option: String, range: ClosedRange<Double>, command: String) -> Double? {
        number(option, range: range, command: command, kind: "seconds", read: { Double($0) })
    }

    /// A bound as people write it: 604800, not 604800.0.
    private func shown(_ bound: some Comparable) -> String {
        let text = "\(bound)"
        return text.hasSuffix(".0") ? String(text.dropLast(2)) : text
    }

    /// `option`'s value read as `kind` and within `range`; nil if it is not given; otherwise exit 2 naming it.
    private func number<Number: Comparable>(
        _ option: String, range: ClosedRange<Number>, command: String, kind: String, read: (String) -> Number?
    ) -> Number? {
        guard let text = value(option) else { return nil }
        guard let number = read(text), range.contains(number) else {
            fail(
                "\(command): \(option) wants \(kind) from \(shown(range.lowerBound)) to \(shown(range.upperBound)), got \(text)",
                code: ExitCode.usage)
        }
        return number
    }
}

/// Runs the worker or the cleanup consumer as operators expect: its /metrics, /healthz and /readyz, its signals
/// (`ServiceRunner`), and exit 78 naming the setting for a refusal that waiting cannot cure.
func runService(_ service: any Service, name: String, metrics: MetricsSettings, logger: Logger) {
    let health = startHealthServer(metrics, logger: logger, service: service)
    signal(SIGPIPE, SIG_IGN)
    if let failure = ServiceRunner.run(service, name: name, logger: logger, interruptedExitCode: ExitCode.interrupted) {
        let message = StartupError(permanent: failure)?.description ?? "\(failure)"
        logger.critical("cannot start", ["error": message])
        fail("configuration error: \(message)", code: ExitCode.configuration)
    }
    health?.shutdown()
}

/// GET /metrics, /healthz and /readyz on METRICS_HOST:METRICS_PORT, unless the port is 0. Several workers on one
/// host with the default settings all want the default port: when it is taken, the endpoint falls back to a free
/// port, logged with a warning and the chosen address. A port someone set that is taken stops start-up.
func startHealthServer(_ metrics: MetricsSettings, logger: Logger, service: any Service) -> HealthServer? {
    guard metrics.port > 0 else { return nil }
    func open(port: Int) throws(HealthServerError) -> HealthServer {
        try HealthServer(
            host: metrics.host, port: port, metrics: { service.metricsText },
            ready: { service.isReady })
    }
    do {
        let server: HealthServer
        do { server = try open(port: metrics.port) } catch  where error.addressInUse && !metrics.portIsExplicit {
            server = try open(port: 0)
            logger.warning(
                "the default metrics port is taken (another worker on this host?): listening on a free port",
                ["http.address": "\(metrics.host):\(server.port)", "http.default_port": String(metrics.port)])
        }
        logger.info("metrics and health endpoint", ["http.address": "\(metrics.host):\(server.port)"])
        return server
    } catch {
        let setting = error.hostUnusable ? SettingTable().metricsHost.name : SettingTable().metricsPort.name
        fail("configuration error: \(setting): \(error)", code: ExitCode.configuration)
    }
}
