import AMQP
import APNs
import Foundation
import Redis
import Telemetry

/// A setting that stops start-up: names the key and what is wrong with it, never its secret value.
public struct ConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    public var key: String
    public var problem: String

    public init(key: String, _ problem: String) {
        self.key = key
        self.problem = problem
    }

    public var description: String { "\(key): \(problem)" }
}

/// Everything the worker reads from its environment (the contract in README.md, every key in config/).
public struct WorkerConfiguration: Sendable {
    public var amqpURL: AMQPURL
    public var amqpCAFile: String?
    /// AMQP heartbeat in seconds (0: none): how fast a dead broker connection is noticed.
    public var amqpHeartbeat: Int
    public var redisURL: RedisURL
    public var apns: APNsClientConfiguration
    public var keyFile: String?
    public var keyID: String?
    public var teamID: String?
    public var certificateFile: String?
    public var certificateKeyFile: String?
    public var defaultTopic: String?
    public var jobsQueue: String
    public var deadTokensQueue: String
    public var failedQueue: String
    /// Fanout exchange dead-token events are published to (by default named like the dead-token queue); the queue
    /// is bound to it, and any other subscriber may bind its own. Empty: publish straight to the queue.
    public var deadTokensExchange: String
    /// Registration events (an app launch reporting its token) that `apns-worker cleanup` applies to the cache.
    public var registrationsQueue: String
    /// `cleanup` removes tokens not registered again for this many days.
    public var inactiveDays: Int
    /// Seconds between two inactivity sweeps of `cleanup`.
    public var sweepInterval: Double
    public var rateLimit: Int
    /// Unacknowledged jobs the broker may hand this worker at once (basic.qos).
    public var prefetch: Int
    /// Notifications handed to the APNs client and not answered yet, at most: bounds memory whatever the jobs'
    /// fan-out, while keeping every connection's streams busy.
    public var maxInFlight: Int
    /// The mass-invalidation guard: this many 400 BadDeviceToken/DeviceTokenNotForTopic answers in one job, when
    /// they are more than half of its answers, are held back as a configuration error instead of removing tokens.
    public var invalidationGuard: MassInvalidationGuard
    /// Attempts at a job's notifications that APNs asked to retry later, before they are parked on the failed queue.
    public var maximumSendAttempts: Int
    /// Seconds a retry waits, by attempt (the last repeats), in delay queues `<jobs>.retry.<ms>ms`.
    public var retryDelays: [Double]
    /// How long SIGTERM waits for jobs under way before leaving them to the broker for redelivery.
    public var shutdownTimeout: Double
    /// Where `/metrics`, `/healthz` and `/readyz` listen; port 0 turns the endpoint off.
    public var metricsHost: String
    public var metricsPort: Int
    public var logLevel: Logger.Level
    public var logFormat: Logger.Format

    /// Reads and checks every setting; the first bad one throws. The command-line tools (`enqueue`, `tokens`,
    /// `stats`, `cleanup`, ...) send nothing to APNs and load without `requiringCredentials`.
    public static func load(from environment: [String: String],
                            requiringCredentials: Bool = true) throws(ConfigurationError) -> WorkerConfiguration {
        func value(_ key: String) -> String? {
            guard let text = environment[key]?.trimmingCharacters(in: .whitespaces), !text.isEmpty else { return nil }
            return text
        }
        func integer(_ key: String, default fallback: Int, range: ClosedRange<Int>) throws(ConfigurationError) -> Int {
            guard let text = value(key) else { return fallback }
            guard let number = Int(text), range.contains(number) else {
                throw ConfigurationError(key: key, "\"\(text)\" is not a whole number from \(range.lowerBound) to \(range.upperBound)")
            }
            return number
        }
        func seconds(_ key: String, default fallback: Double) throws(ConfigurationError) -> Double {
            guard let text = value(key) else { return fallback }
            guard let number = Double(text), number > 0, number <= 86_400 else {
                throw ConfigurationError(key: key, "\"\(text)\" is not a number of seconds above 0")
            }
            return number
        }
        func file(_ key: String) throws(ConfigurationError) -> String? {
            guard let path = value(key) else { return nil }
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
                throw ConfigurationError(key: key, "no file \(path)")
            }
            guard !isDirectory.boolValue else { throw ConfigurationError(key: key, "\(path) is a directory, not a file") }
            guard FileManager.default.isReadableFile(atPath: path) else {
                throw ConfigurationError(key: key, "cannot read file \(path) (permissions)")
            }
            return path
        }
        func delays(_ key: String, default fallback: [Double]) throws(ConfigurationError) -> [Double] {
            guard let text = value(key) else { return fallback }
            let parsed = text.split(separator: ",").map { Double($0.trimmingCharacters(in: .whitespaces)) }
            guard !parsed.isEmpty, parsed.allSatisfy({ $0 != nil && $0! >= 0.001 && $0! <= 86_400 }) else {
                throw ConfigurationError(key: key, "\"\(text)\" is not a comma-separated list of seconds, e.g. 1,15,60,300")
            }
            return parsed.map { $0! }.sorted()
        }
        func queue(_ key: String, default fallback: String) throws(ConfigurationError) -> String {
            let name = value(key) ?? fallback
            guard name.utf8.count <= 255 else { throw ConfigurationError(key: key, "queue names are at most 255 bytes") }
            return name
        }

        let amqpURL: AMQPURL
        do { amqpURL = try AMQPURL(value("AMQP_URL") ?? "amqp://guest:guest@127.0.0.1:5672/%2f") } catch {
            throw ConfigurationError(key: "AMQP_URL", error.message.replacingOccurrences(of: "AMQP_URL: ", with: ""))
        }
        let redisURL: RedisURL
        do { redisURL = try RedisURL(value("REDIS_URL") ?? "redis://127.0.0.1:6379/0") } catch {
            throw ConfigurationError(key: "REDIS_URL", error.message.replacingOccurrences(of: "REDIS_URL: ", with: ""))
        }
        var apns = APNsClientConfiguration()
        for (key, environmentName) in [("APNS_PRODUCTION_URL", APNsEnvironment.production), ("APNS_SANDBOX_URL", .sandbox)] {
            guard let text = value(key) else { continue }
            do {
                let endpoint = try APNsEndpoint(url: text)
                if environmentName == .production { apns.production = endpoint } else { apns.sandbox = endpoint }
            } catch { throw ConfigurationError(key: key, error.description) }
        }
        apns.caFile = try file("APNS_CA_FILE")
        apns.connectionsPerEnvironment = try integer("APNS_CONNECTIONS", default: 2, range: 1...64)
        apns.requestTimeout = try seconds("APNS_REQUEST_TIMEOUT", default: 30)
        apns.pingInterval = try seconds("APNS_PING_INTERVAL", default: 3600)
        apns.pingTimeout = try seconds("APNS_PING_TIMEOUT", default: 15)
        if let insecure = value("APNS_INSECURE_SKIP_VERIFY") {
            guard ["true", "false", "1", "0"].contains(insecure) else {
                throw ConfigurationError(key: "APNS_INSECURE_SKIP_VERIFY", "must be true or false")
            }
            apns.verifyPeer = !(insecure == "true" || insecure == "1")
        }

        let keyFile = try file("APNS_KEY_FILE")
        let keyID = value("APNS_KEY_ID")
        let teamID = value("APNS_TEAM_ID")
        let certificateFile = try file("APNS_CERT_FILE")
        let certificateKeyFile = try file("APNS_CERT_KEY_FILE")
        if keyFile != nil || !requiringCredentials {
            if keyFile != nil && keyID == nil { throw ConfigurationError(key: "APNS_KEY_ID", "required with APNS_KEY_FILE") }
            if keyFile != nil && teamID == nil { throw ConfigurationError(key: "APNS_TEAM_ID", "required with APNS_KEY_FILE") }
        } else if certificateFile == nil {
            throw ConfigurationError(key: "APNS_KEY_FILE",
                                     "no APNs credentials: set APNS_KEY_FILE, APNS_KEY_ID and APNS_TEAM_ID, or APNS_CERT_FILE")
        }

        let defaultTopic = value("APNS_TOPIC")
        if let defaultTopic, let problem = HeaderValue.problem(defaultTopic, allowsInnerSpaces: false) {
            throw ConfigurationError(key: "APNS_TOPIC", "\(problem): it is sent as the apns-topic header")
        }
        let levelText = value("LOG_LEVEL") ?? "info"
        guard let level = Logger.Level(name: levelText) else {
            throw ConfigurationError(key: "LOG_LEVEL", "\"\(levelText)\" is not trace, debug, info, notice, warning or error")
        }
        let formatText = value("LOG_FORMAT") ?? "json"
        guard let format = Logger.Format(rawValue: formatText) else {
            throw ConfigurationError(key: "LOG_FORMAT", "\"\(formatText)\" is not json or text")
        }

        let deadTokensQueue = try queue("PUSH_DEAD_TOKENS_QUEUE", default: "push.dead-tokens")
        return WorkerConfiguration(
            amqpURL: amqpURL, amqpCAFile: try file("AMQP_CA_FILE"),
            amqpHeartbeat: try integer("AMQP_HEARTBEAT", default: 30, range: 0...3600), redisURL: redisURL, apns: apns,
            keyFile: keyFile, keyID: keyID, teamID: teamID, certificateFile: certificateFile,
            certificateKeyFile: certificateKeyFile, defaultTopic: defaultTopic,
            jobsQueue: try queue("PUSH_JOBS_QUEUE", default: "push.jobs"),
            deadTokensQueue: deadTokensQueue,
            failedQueue: try queue("PUSH_FAILED_QUEUE", default: "push.failed"),
            // By default the exchange has the queue's name (exchanges and queues are apart in AMQP): two deployments
            // with different queues on one broker then never receive each other's events. Set but empty means no
            // exchange (publish straight to the queue), so not `queue()`'s default rule.
            deadTokensExchange: environment["PUSH_DEAD_TOKENS_EXCHANGE"] == nil ? deadTokensQueue
                : try queue("PUSH_DEAD_TOKENS_EXCHANGE", default: ""),
            registrationsQueue: try queue("PUSH_REGISTRATIONS_QUEUE", default: "push.registrations"),
            inactiveDays: try integer("CLEANUP_INACTIVE_DAYS", default: 90, range: 1...3650),
            sweepInterval: try seconds("CLEANUP_SWEEP_INTERVAL", default: 3600),
            rateLimit: try integer("APNS_RATE_LIMIT", default: 0, range: 0...10_000_000),
            prefetch: try integer("WORKER_PREFETCH", default: 500, range: 1...65_535),
            maxInFlight: try integer("WORKER_MAX_IN_FLIGHT", default: 5_000, range: 2...1_000_000),
            invalidationGuard: MassInvalidationGuard(
                threshold: try integer("WORKER_MASS_INVALIDATION_THRESHOLD", default: 20, range: 1...1_000_000)),
            maximumSendAttempts: try integer("APNS_MAX_ATTEMPTS", default: 3, range: 1...100),
            retryDelays: try delays("APNS_RETRY_DELAYS", default: [1, 15, 60, 300]),
            shutdownTimeout: try seconds("SHUTDOWN_TIMEOUT", default: 25),
            metricsHost: value("METRICS_HOST") ?? "0.0.0.0",
            metricsPort: try integer("METRICS_PORT", default: 9464, range: 0...65535),
            logLevel: level, logFormat: format)
    }

    /// Both kinds of credentials set: which one is used, for the log (token authentication wins).
    public var credentialChoice: String? {
        guard keyFile != nil, certificateFile != nil else { return nil }
        return "APNS_KEY_FILE and APNS_CERT_FILE are both set: token authentication with APNS_KEY_FILE is used; "
            + "the certificate is ignored (unset one of them)"
    }

    /// What is wrong with the private key file's permissions, if anything: a provider key signs for the whole team,
    /// so nobody but the worker's user should be able to read it (chmod 600 or 400).
    public func keyFilePermissionProblem() -> String? {
        guard let path = keyFile ?? certificateKeyFile ?? certificateFile,
              let attributes = try? FileManager.default.attributesOfItem(atPath: path),
              let mode = (attributes[.posixPermissions] as? NSNumber)?.intValue else { return nil }
        guard mode & 0o077 != 0 else { return nil }
        let who = mode & 0o004 != 0 ? "every user on this machine" : "its group"
        return "\(path) is readable or writable by \(who) (mode \(String(mode, radix: 8))): chmod 600 it"
    }

    /// Token authentication if a key is configured, else the client certificate. Reads and checks the key.
    public func makeAuthentication() throws(ConfigurationError) -> APNsAuthentication {
        if let keyFile, let keyID, let teamID {
            do {
                let key = try ES256Key(contentsOfFile: keyFile)
                return .token(try APNsTokenProvider(key: key, keyID: keyID, teamID: teamID))
            } catch {
                let field: String
                if case .badIdentifier(let name, _) = error { field = name } else { field = "APNS_KEY_FILE" }
                throw ConfigurationError(key: field, error.description)
            }
        }
        if let certificateFile { return .certificate(certificateFile: certificateFile, privateKeyFile: certificateKeyFile) }
        throw ConfigurationError(key: "APNS_KEY_FILE", APNsConfigurationError.noCredentials.description)
    }
}
