import AMQP
import AMQPBroker
import APNs
import Foundation
import Redis
import Telemetry
import WorkerPipeline

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

/// The credential a worker proves itself to APNs with, and the app it speaks for: one value per credential (today
/// one per process; several teams will be several of these).
public struct CredentialSettings: Sendable, Equatable {
    public enum Proof: Sendable, Equatable {
        /// Token authentication: Apple's .p8 signing key, its key id and the team id.
        case signingKey(file: String, keyID: String, teamID: String)
        /// Certificate authentication: a PEM certificate and its key (the key may sit in the certificate file).
        case certificate(file: String, keyFile: String?)
    }

    /// nil for the tools that send nothing to APNs.
    public var proof: Proof?
    /// APNS_TOPIC: the topic of jobs that name none, the app whose plain cache entries serve it.
    public var defaultTopic: String?
    /// Both kinds were set (the key is used): worth a warning.
    public var ignoredCertificate: Bool

    /// The private key file: the one file nobody but the worker's user should read.
    public var privateKeyFile: String? {
        switch proof {
        case .signingKey(let file, _, _)?: file
        case .certificate(let file, let keyFile)?: keyFile ?? file
        case nil: nil
        }
    }

    /// Token authentication if a key is configured, else the client certificate. Reads and checks the key.
    public func makeAuthentication() throws(ConfigurationError) -> APNsAuthentication {
        switch proof {
        case .signingKey(let file, let keyID, let teamID)?:
            do {
                let key = try ES256Key(contentsOfFile: file)
                return .token(try APNsTokenProvider(key: key, keyID: keyID, teamID: teamID))
            } catch {
                if case .badIdentifier(let field, _) = error {
                    throw ConfigurationError(key: field == .keyID ? "APNS_KEY_ID" : "APNS_TEAM_ID", error.description)
                }
                throw ConfigurationError(key: "APNS_KEY_FILE", error.description)
            }
        case .certificate(let file, let keyFile)?:
            return .certificate(certificateFile: file, privateKeyFile: keyFile)
        case nil:
            throw ConfigurationError(key: "APNS_KEY_FILE", "no APNs credentials: set APNS_KEY_FILE, APNS_KEY_ID and "
                                     + "APNS_TEAM_ID (token), or APNS_CERT_FILE (certificate)")
        }
    }

    /// What is wrong with the private key file's permissions, if anything: a provider key signs for the whole team,
    /// so nobody but the worker's user should be able to read it (chmod 600 or 400).
    public func privateKeyPermissionProblem() -> String? {
        guard let path = privateKeyFile,
              let attributes = try? FileManager.default.attributesOfItem(atPath: path),
              let mode = (attributes[.posixPermissions] as? NSNumber)?.intValue else { return nil }
        guard mode & 0o077 != 0 else { return nil }
        let who = mode & 0o004 != 0 ? "every user on this machine" : "its group"
        return "\(path) is readable or writable by \(who) (mode \(String(mode, radix: 8))): chmod 600 it"
    }

    /// Both kinds of credentials set: which one is used, for the log.
    public var choice: String? {
        ignoredCertificate ? "APNS_KEY_FILE and APNS_CERT_FILE are both set: token authentication with APNS_KEY_FILE "
            + "is used; the certificate is ignored (unset one of them)" : nil
    }
}

/// `apns-worker cleanup`'s own settings.
public struct CleanupSettings: Sendable, Equatable {
    /// Tokens not registered again for this many days are swept.
    public var inactiveDays: Int
    /// Seconds between two sweeps.
    public var sweepInterval: Double
}

/// Where `/metrics`, `/healthz` and `/readyz` listen.
public struct MetricsSettings: Sendable, Equatable {
    public static let defaultPort = 9464

    public var host: String
    /// 0 turns the endpoint off.
    public var port: Int
    /// METRICS_PORT was set. A default port that is taken falls back to a free one (several workers on one host); a
    /// port someone chose that is taken stops start-up.
    public var portIsExplicit: Bool
}

/// Every setting, read from one place (the environment, a settings file, flags: the contract in README.md, every
/// key in config/apns-worker.env) and grouped by what uses it: the wrappers and the pipeline take these typed values
/// and never name an environment variable; this layer alone maps keys to values and to the error lines that name
/// them.
public struct WorkerConfiguration: Sendable {
    public var broker: AMQPJobBroker.Settings
    public var redisURL: RedisURL
    /// Notifications per second shared by every worker on the same Redis; 0: none.
    public var rateLimit: Int
    /// The share of the rate limit urgent work can always take at once, however busy the bulk lane (0...1).
    public var rateLimitUrgentShare: Double
    public var apns: APNsClientConfiguration
    public var credential: CredentialSettings
    public var pipeline: WorkerSettings
    public var cleanup: CleanupSettings
    public var metrics: MetricsSettings
    public var logLevel: Logger.Level
    public var logFormat: Logger.Format

    /// Reads and checks every setting; the first bad one throws. The command-line tools (`enqueue`, `tokens`,
    /// `stats`, `cleanup`, ...) send nothing to APNs and load without `requiringCredentials`.
    /// Debug builds only: TEST_FAULT_EXIT_ON_JOB=<job id> makes the worker exit when it starts that job, for the
    /// tests of poison jobs. Release builds ignore it.
    static func testFault(_ environment: [String: String]) -> String? {
        #if DEBUG
        return environment["TEST_FAULT_EXIT_ON_JOB"]
        #else
        return nil
        #endif
    }

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
        func fraction(_ key: String, default fallback: Double) throws(ConfigurationError) -> Double {
            guard let text = value(key) else { return fallback }
            guard let number = Double(text), (0...1).contains(number) else {
                throw ConfigurationError(key: key, "\"\(text)\" is not a number from 0 to 1 (a share, e.g. 0.2)")
            }
            return number
        }
        /// Unset: quorum when AMQP_URL names several nodes (a cluster, where a classic queue dies with its node),
        /// classic for one (where a quorum queue costs more and replicates nothing).
        func queueType(nodes: AMQPNodes) throws(ConfigurationError) -> QueueType {
            guard let text = value("PUSH_QUEUE_TYPE") else { return nodes.urls.count > 1 ? .quorum : .classic }
            guard let type = QueueType(rawValue: text) else {
                throw ConfigurationError(key: "PUSH_QUEUE_TYPE", "\"\(text)\" is not classic or quorum")
            }
            return type
        }
        func queue(_ key: String, default fallback: String) throws(ConfigurationError) -> String {
            let name = value(key) ?? fallback
            guard name.utf8.count <= 255 else { throw ConfigurationError(key: key, "queue names are at most 255 bytes") }
            return name
        }

        let amqpNodes: AMQPNodes
        do { amqpNodes = try AMQPNodes(value("AMQP_URL") ?? "amqp://guest:guest@127.0.0.1:5672/%2f") } catch {
            throw ConfigurationError(key: "AMQP_URL", error.message)
        }
        let redisURL: RedisURL
        do { redisURL = try RedisURL(value("REDIS_URL") ?? "redis://127.0.0.1:6379/0") } catch {
            throw ConfigurationError(key: "REDIS_URL", error.message)
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
        var proof: CredentialSettings.Proof?
        if let keyFile {
            guard let keyID else { throw ConfigurationError(key: "APNS_KEY_ID", "required with APNS_KEY_FILE") }
            guard let teamID else { throw ConfigurationError(key: "APNS_TEAM_ID", "required with APNS_KEY_FILE") }
            proof = .signingKey(file: keyFile, keyID: keyID, teamID: teamID)
        } else if let certificateFile {
            proof = .certificate(file: certificateFile, keyFile: certificateKeyFile)
        } else if requiringCredentials {
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
        let jobsQueue = try queue("PUSH_JOBS_QUEUE", default: "push.jobs")
        let bulkQueue = try queue("PUSH_BULK_QUEUE", default: "push.bulk")
        // One queue for both lanes would make two consumers of it: every job would land in either lane by chance.
        guard bulkQueue != jobsQueue else {
            throw ConfigurationError(key: "PUSH_BULK_QUEUE", "\"\(bulkQueue)\" is PUSH_JOBS_QUEUE too: the bulk lane needs a queue of its own")
        }
        let queues = QueueNames(
            jobs: jobsQueue, bulk: bulkQueue,
            failed: try queue("PUSH_FAILED_QUEUE", default: "push.failed"),
            deadTokens: deadTokensQueue,
            // By default the exchange has the queue's name (exchanges and queues are apart in AMQP): two deployments
            // with different queues on one broker then never receive each other's events. Set but empty means no
            // exchange (publish straight to the queue), so not `queue()`'s default rule.
            deadTokensExchange: environment["PUSH_DEAD_TOKENS_EXCHANGE"] == nil ? deadTokensQueue
                : try queue("PUSH_DEAD_TOKENS_EXCHANGE", default: ""),
            registrations: try queue("PUSH_REGISTRATIONS_QUEUE", default: "push.registrations"),
            type: try queueType(nodes: amqpNodes))
        let retryDelays = try delays("APNS_RETRY_DELAYS", default: [1, 15, 60, 300])
        let prefetch = try integer("WORKER_PREFETCH", default: 500, range: 1...65_535)
        let bulkPrefetch = try integer("WORKER_BULK_PREFETCH", default: 100, range: 1...65_535)
        let core = WorkerCore.Settings(
            prefetch: prefetch + bulkPrefetch,
            maximumNotificationsInFlight: try integer("WORKER_MAX_IN_FLIGHT", default: 5_000, range: 2...1_000_000),
            shutdownTimeout: try seconds("SHUTDOWN_TIMEOUT", default: 25))
        return WorkerConfiguration(
            broker: AMQPJobBroker.Settings(nodes: amqpNodes, caFile: try file("AMQP_CA_FILE"),
                                           heartbeat: try integer("AMQP_HEARTBEAT", default: 30, range: 0...3600),
                                           queues: queues, retryDelays: retryDelays, prefetch: prefetch,
                                           bulkPrefetch: bulkPrefetch),
            redisURL: redisURL,
            rateLimit: try integer("APNS_RATE_LIMIT", default: 0, range: 0...10_000_000),
            rateLimitUrgentShare: try fraction("APNS_RATE_LIMIT_URGENT_SHARE", default: 0.2),
            apns: apns,
            credential: CredentialSettings(proof: proof, defaultTopic: defaultTopic,
                                           ignoredCertificate: keyFile != nil && certificateFile != nil),
            pipeline: WorkerSettings(
                core: core, defaultTopic: defaultTopic,
                invalidationGuard: MassInvalidationGuard(
                    threshold: try integer("WORKER_MASS_INVALIDATION_THRESHOLD", default: 20, range: 1...1_000_000)),
                maximumSendAttempts: try integer("APNS_MAX_ATTEMPTS", default: 3, range: 1...100),
                retryDelays: retryDelays,
                maximumDeliveries: try integer("WORKER_MAX_DELIVERIES", default: 5, range: 1...1_000),
                exitOnJobID: Self.testFault(environment)),
            cleanup: CleanupSettings(inactiveDays: try integer("CLEANUP_INACTIVE_DAYS", default: 90, range: 1...3650),
                                     sweepInterval: try seconds("CLEANUP_SWEEP_INTERVAL", default: 3600)),
            metrics: MetricsSettings(host: value("METRICS_HOST") ?? "0.0.0.0",
                                     port: try integer("METRICS_PORT", default: MetricsSettings.defaultPort, range: 0...65535),
                                     portIsExplicit: value("METRICS_PORT") != nil),
            logLevel: level, logFormat: format)
    }
}
