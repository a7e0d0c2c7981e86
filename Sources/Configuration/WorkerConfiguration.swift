import AMQP
import AMQPBroker
import APNs
import Foundation
import Redis
import TLS
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

    /// An error naming a setting of the table.
    init(_ key: KeyPath<SettingTable, some SettingEntry>, _ problem: String) {
        self.init(key: WorkerConfiguration.name(key), problem)
    }

    public var description: String { "\(key): \(problem)" }
}

/// A setting's name, for messages that name another setting than their own.
private func name(_ key: KeyPath<SettingTable, some SettingEntry>) -> String { WorkerConfiguration.name(key) }

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
    /// The topic of jobs that name none, the app whose plain cache entries serve it.
    public var defaultTopic: String?
    /// Both kinds were set (the key is used): worth a warning.
    public var ignoredCertificate: Bool
    /// When the client certificate expires (certificate authentication only).
    public var certificateExpiry: Date?
    /// APNS_CREDENTIALS_FILE: more credentials, each for the bundle IDs it lists (read by `makeCredentials`).
    public var credentialsFile: String?

    /// Days before expiry from which the worker warns at start.
    public static let expiryWarningDays = 30

    /// A warning for each client certificate that expires within `expiryWarningDays`.
    public static func certificateExpiryWarnings(_ credentials: APNsCredentials, now: Date = Date())
        -> [(message: String, metadata: [String: String])]
    {
        credentials.all.compactMap { credential in
            guard let expiry = credential.certificateExpiry,
                expiry.timeIntervalSince(now) < Double(expiryWarningDays) * 86_400
            else { return nil }
            let days = Int(expiry.timeIntervalSince(now) / 86_400)
            return (
                "the APNs client certificate expires in \(days) days: renew it, then reload the workers (SIGHUP)",
                [
                    "apns.credential": credential.name,
                    "apns.certificate_expiry": ISO8601DateFormatter().string(from: expiry),
                    "apns.topics": credential.bundles.isEmpty
                        ? (credentials.defaultTopic ?? "")
                        : credential.bundles.sorted().joined(separator: ",")
                ]
            )
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
                    throw field == .keyID
                        ? ConfigurationError(\.apnsKeyID, error.description)
                        : ConfigurationError(\.apnsTeamID, error.description)
                }
                throw ConfigurationError(\.apnsKeyFile, error.description)
            }
        case .certificate(let file, let keyFile)?:
            return .certificate(certificateFile: file, privateKeyFile: keyFile)
        case nil:
            throw ConfigurationError(
                \.apnsKeyFile,
                "no APNs credentials: set \(name(\.apnsKeyFile)), "
                    + "\(name(\.apnsKeyID)) and \(name(\.apnsTeamID)) (token), or \(name(\.apnsCertFile)) "
                    + "(certificate)")
        }
    }

    /// What is wrong with a private key file's permissions, if anything: a provider key signs for the whole team,
    /// so nobody but the worker's user should be able to read it (chmod 600 or 400).
    public func privateKeyPermissionProblems() -> [String] {
        privateKeyFiles().compactMap(Self.privateKeyPermissionProblem)
    }

    static func privateKeyPermissionProblem(_ path: String) -> String? {
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
            let mode = (attributes[.posixPermissions] as? NSNumber)?.intValue
        else { return nil }
        guard mode & 0o077 != 0 else { return nil }
        let who = mode & 0o004 != 0 ? "every user on this machine" : "its group"
        return "\(path) is readable or writable by \(who) (mode \(String(mode, radix: 8))): chmod 600 it"
    }

    /// Both kinds of credentials set: which one is used, for the log.
    public var choice: String? {
        ignoredCertificate
            ? "\(name(\.apnsKeyFile)) and \(name(\.apnsCertFile)) are both set: token authentication "
                + "with \(name(\.apnsKeyFile)) is used; the certificate is ignored (unset one of them)" : nil
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
    public var host: String
    /// 0 turns the endpoint off.
    public var port: Int
    /// METRICS_PORT was set. A default port that is taken falls back to a free one (several workers on one host); a
    /// port someone chose that is taken stops start-up.
    public var portIsExplicit: Bool
}

/// Every setting, read from one place (the environment, a settings file, flags: the contract in docs/contract.md, every
/// key in config/apns-worker.env) and grouped by what uses it: the wrappers and the pipeline take these typed values
/// and never name an environment variable; this layer alone maps keys to values and to the error lines that name
/// them.
public struct WorkerConfiguration: Sendable {
    public var broker: AMQPJobBroker.Settings
    /// Where Redis is; every program connects through `RedisDeployment.connect`.
    public var redis: RedisDeployment
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

    /// Reads and checks every setting (each an entry of `SettingTable`); the first bad one throws. The command-line
    /// tools (`enqueue`, `tokens`, `stats`, `cleanup`, ...) send nothing to APNs and load without
    /// `requiringCredentials`.
    public static func load(
        from environment: [String: String],
        requiringCredentials: Bool = true
    ) throws(ConfigurationError) -> WorkerConfiguration {
        let settings = SettingValues(environment)
        let nodes = try settings(\.amqpURL)
        let redis = try redisDeployment(settings)
        let apns = try apnsClient(settings)
        let credential = try credential(settings, required: requiringCredentials)
        let logLevel = try settings(\.logLevel)
        let logFormat = try settings(\.logFormat)
        let queues = try queueNames(settings, nodes: nodes)
        let broker = try brokerSettings(settings, nodes: nodes, queues: queues)
        return WorkerConfiguration(
            broker: broker, redis: redis,
            rateLimit: try settings(\.apnsRateLimit), rateLimitUrgentShare: try settings(\.apnsRateLimitUrgentShare),
            apns: apns, credential: credential,
            pipeline: try pipeline(
                settings, broker: broker, defaultTopic: credential.defaultTopic,
                exitOnJobID: testFault(environment)),
            cleanup: CleanupSettings(
                inactiveDays: try settings(\.cleanupInactiveDays),
                sweepInterval: try settings(\.cleanupSweepInterval)),
            metrics: MetricsSettings(
                host: try settings(\.metricsHost),
                port: try settings(\.metricsPort) ?? SettingTable.defaultMetricsPort,
                portIsExplicit: settings.isGiven(\.metricsPort)),
            logLevel: logLevel, logFormat: logFormat)
    }

    /// Debug builds only: TEST_FAULT_EXIT_ON_JOB=<job id> makes the worker exit when it starts that job, for the
    /// tests of poison jobs. Release builds ignore it (so it is no setting of the table).
    static func testFault(_ environment: [String: String]) -> String? {
        #if DEBUG
            return environment["TEST_FAULT_EXIT_ON_JOB"]
        #else
            return nil
        #endif
    }

    /// One node (REDIS_URL), a master its sentinels name (REDIS_SENTINELS, REDIS_MASTER_NAME), or a cluster
    /// (REDIS_CLUSTER_NODES). Beside the sentinels or the cluster's nodes, REDIS_URL may give the data nodes' user,
    /// password (and beside sentinels, database), but no host, since a second place to find Redis would leave which
    /// one is meant to chance.
    private static func redisDeployment(_ settings: SettingValues) throws(ConfigurationError) -> RedisDeployment {
        switch try redisPlacement(settings) {
        case .node(let url):
            return .node(try withTLSFiles(url, settings))
        case .sentinel(var sentinels):
            sentinels.dataNodes = try withTLSFiles(sentinels.dataNodes, settings)
            return .sentinel(sentinels)
        case .cluster(var nodes):
            nodes.dataNodes = try withTLSFiles(nodes.dataNodes, settings)
            return .cluster(nodes)
        }
    }

    /// REDIS_CA_FILE, REDIS_CERT_FILE and REDIS_CERT_KEY_FILE on a rediss:// URL; given beside a redis:// one, they
    /// would be ignored, so they stop start-up instead.
    private static func withTLSFiles(_ url: RedisURL, _ settings: SettingValues) throws(ConfigurationError) -> RedisURL
    {
        let files = RedisTLS(
            caFile: try settings(\.redisCAFile), certificateFile: try settings(\.redisCertFile),
            keyFile: try settings(\.redisCertKeyFile))
        guard url.tls != nil else {
            for key in [\SettingTable.redisCAFile, \.redisCertFile, \.redisCertKeyFile] where settings.isGiven(key) {
                throw ConfigurationError(key, "given, but REDIS_URL is not rediss:// (TLS)")
            }
            return url
        }
        if files.keyFile != nil && files.certificateFile == nil {
            throw ConfigurationError(
                \.redisCertKeyFile, "given without \(name(\.redisCertFile)), the certificate it is the key of")
        }
        var secured = url
        secured.tls = files
        return secured
    }

    private static func redisPlacement(_ settings: SettingValues) throws(ConfigurationError) -> RedisDeployment {
        let clusterNodes = try settings(\.redisClusterNodes)
        guard let sentinels = try settings(\.redisSentinels) else {
            for key in [\SettingTable.redisMasterName, \.redisSentinelPassword] where settings.isGiven(key) {
                throw ConfigurationError(key, "given without \(name(\.redisSentinels))")
            }
            guard let clusterNodes else { return .node(try settings(\.redisURL)) }
            let dataNodes = try dataNodes(settings, beside: \.redisClusterNodes)
            guard dataNodes.database == 0 else {
                throw ConfigurationError(
                    \.redisURL,
                    "names database \(dataNodes.database): a Redis Cluster has "
                        + "database 0 only")
            }
            return .cluster(RedisClusterNodes(seeds: clusterNodes, dataNodes: dataNodes))
        }
        guard clusterNodes == nil else {
            throw ConfigurationError(
                \.redisClusterNodes,
                "given beside \(name(\.redisSentinels)): a Redis is either "
                    + "watched by sentinels or a cluster; give one of the two")
        }
        guard let masterName = try settings(\.redisMasterName) else {
            throw ConfigurationError(\.redisMasterName, "required with \(name(\.redisSentinels))")
        }
        return .sentinel(
            RedisSentinels(
                sentinels: sentinels, masterName: masterName,
                sentinelPassword: try settings(\.redisSentinelPassword),
                dataNodes: try dataNodes(settings, beside: \.redisSentinels)))
    }

    /// REDIS_URL beside the setting that says where the nodes are: their credentials (and database) only.
    private static func dataNodes(
        _ settings: SettingValues, beside nodes: KeyPath<SettingTable, OptionalSetting<[RedisAddress]>>
    )
        throws(ConfigurationError) -> RedisURL
    {
        guard let text = settings.text(\.redisURL) else { return RedisURL() }
        let dataNodes: RedisURL
        do throws(RedisError) { dataNodes = try RedisURL(text, requiringHost: false) } catch {
            throw ConfigurationError(\.redisURL, error.message)
        }
        guard dataNodes.host.isEmpty else {
            throw ConfigurationError(
                \.redisURL,
                "names a Redis (\(dataNodes.host)) beside \(name(nodes)): give one of "
                    + "the two; beside it, REDIS_URL holds only the nodes' password and database "
                    + "(redis://:password@/db)")
        }
        return dataNodes
    }

    private static func apnsClient(_ settings: SettingValues) throws(ConfigurationError) -> APNsClientConfiguration {
        var apns = APNsClientConfiguration()
        apns.production = try settings(\.apnsProductionURL)
        apns.sandbox = try settings(\.apnsSandboxURL)
        apns.channelsProduction = try settings(\.apnsChannelsProductionURL)
        apns.channelsSandbox = try settings(\.apnsChannelsSandboxURL)
        apns.caFile = try settings(\.apnsCAFile)
        apns.proxy = try settings(\.apnsProxyURL)
        apns.connectionsPerEnvironment = try settings(\.apnsConnections)
        apns.maximumConnectionsPerEnvironment = try maximumConnections(
            settings, atLeast: apns.connectionsPerEnvironment)
        apns.requestTimeout = try settings(\.apnsRequestTimeout)
        apns.pingInterval = try settings(\.apnsPingInterval)
        apns.pingTimeout = try settings(\.apnsPingTimeout)
        apns.verifyPeer = !(try settings(\.apnsInsecureSkipVerify))
        // The pipeline records a delivery without reading its answer's fields.
        apns.keepsDeliveredAPNsID = false
        return apns
    }

    /// APNS_MAX_CONNECTIONS, never below APNS_CONNECTIONS: given below it, an error naming both; left unset, raised
    /// to it.
    private static func maximumConnections(
        _ settings: SettingValues,
        atLeast minimum: Int
    ) throws(ConfigurationError) -> Int {
        let maximum = try settings(\.apnsMaxConnections)
        guard settings.isGiven(\.apnsMaxConnections) else { return max(maximum, minimum) }
        guard maximum >= minimum else {
            throw ConfigurationError(
                \.apnsMaxConnections,
                "\(maximum) is below \(name(\.apnsConnections)) (\(minimum)): "
                    + "the pool's most connections cannot be fewer than it keeps open; raise "
                    + "\(name(\.apnsMaxConnections)) or lower \(name(\.apnsConnections))")
        }
        return maximum
    }

    private static func credential(
        _ settings: SettingValues,
        required: Bool
    ) throws(ConfigurationError) -> CredentialSettings {
        let keyFile = try settings(\.apnsKeyFile)
        let keyID = try settings(\.apnsKeyID)
        let teamID = try settings(\.apnsTeamID)
        let certificateFile = try settings(\.apnsCertFile)
        let certificateKeyFile = try settings(\.apnsCertKeyFile)
        var proof: CredentialSettings.Proof?
        var certificateExpiry: Date?
        if let keyFile {
            guard let keyID else { throw ConfigurationError(\.apnsKeyID, "required with \(name(\.apnsKeyFile))") }
            guard let teamID else { throw ConfigurationError(\.apnsTeamID, "required with \(name(\.apnsKeyFile))") }
            proof = .signingKey(file: keyFile, keyID: keyID, teamID: teamID)
        } else if let certificateFile {
            proof = .certificate(file: certificateFile, keyFile: certificateKeyFile)
            do throws(CredentialProblem) {
                certificateExpiry = try CredentialSettings.checkCertificate(
                    certificateFile, keyFile: certificateKeyFile
                ).expiry
            } catch {
                throw ConfigurationError(\.apnsCertFile, error.description)
            }
        }
        let credentialsFile = try settings(\.apnsCredentialsFile)
        if required && proof == nil && credentialsFile == nil {
            throw ConfigurationError(
                \.apnsKeyFile,
                "no APNs credentials: set \(name(\.apnsKeyFile)), \(name(\.apnsKeyID)) "
                    + "and \(name(\.apnsTeamID)), or \(name(\.apnsCertFile)), or "
                    + "\(name(\.apnsCredentialsFile))")
        }
        return CredentialSettings(
            proof: proof, defaultTopic: try settings(\.apnsTopic),
            ignoredCertificate: keyFile != nil && certificateFile != nil,
            certificateExpiry: certificateExpiry, credentialsFile: credentialsFile)
    }

    private static func queueNames(_ settings: SettingValues, nodes: AMQPNodes) throws(ConfigurationError) -> QueueNames
    {
        let deadTokensQueue = try settings(\.pushDeadTokensQueue)
        let jobsQueue = try settings(\.pushJobsQueue)
        let bulkQueue = try settings(\.pushBulkQueue)
        // One queue for both lanes would make two consumers of it: every job would land in either lane by chance.
        guard bulkQueue != jobsQueue else {
            throw ConfigurationError(
                \.pushBulkQueue,
                "\"\(bulkQueue)\" is \(name(\.pushJobsQueue)) too: the bulk lane "
                    + "needs a queue of its own")
        }
        return QueueNames(
            jobs: jobsQueue, bulk: bulkQueue, failed: try settings(\.pushFailedQueue), deadTokens: deadTokensQueue,
            // By default the exchange has the queue's name (exchanges and queues are apart in AMQP): two deployments
            // with different queues on one broker then never receive each other's events. Given but empty means no
            // exchange (publish straight to the queue).
            deadTokensExchange: settings.isPresent(\.pushDeadTokensExchange)
                ? try settings(\.pushDeadTokensExchange) ?? "" : deadTokensQueue,
            registrations: try settings(\.pushRegistrationsQueue),
            // Unset: quorum when several nodes are given (a cluster, where a classic queue dies with its node),
            // classic for one (where a quorum queue costs more and replicates nothing).
            type: try settings(\.pushQueueType) ?? (nodes.urls.count > 1 ? .quorum : .classic))
    }

    private static func brokerSettings(
        _ settings: SettingValues, nodes: AMQPNodes,
        queues: QueueNames
    ) throws(ConfigurationError) -> AMQPJobBroker.Settings {
        let retryDelays = try settings(\.apnsRetryDelays)
        let prefetch = try settings(\.workerPrefetch)
        let bulkPrefetch = try settings(\.workerBulkPrefetch)
        return AMQPJobBroker.Settings(
            nodes: nodes, caFile: try settings(\.amqpCAFile),
            heartbeat: try settings(\.amqpHeartbeat), queues: queues,
            retryDelays: retryDelays, prefetch: prefetch, bulkPrefetch: bulkPrefetch,
            bulkPrefetchBytes: try settings(\.workerBulkPrefetchBytes))
    }

    private static func pipeline(
        _ settings: SettingValues, broker: AMQPJobBroker.Settings, defaultTopic: String?,
        exitOnJobID: String?
    ) throws(ConfigurationError) -> WorkerSettings {
        let core = WorkerCore.Settings(
            prefetch: broker.prefetch + broker.bulkPrefetch,
            maximumNotificationsInFlight: try settings(\.workerMaxInFlight),
            shutdownTimeout: try settings(\.shutdownTimeout),
            bulkAdmission: BulkAdmission(
                maximumBytes: try settings(\.workerBulkAdmissionBytes),
                maximumTargets: try settings(\.workerBulkAdmissionTargets)))
        return WorkerSettings(
            core: core, defaultTopic: defaultTopic,
            invalidationGuard: MassInvalidationGuard(
                threshold: try settings(\.workerMassInvalidationThreshold),
                share: try settings(\.workerMassInvalidationShare)),
            maximumSendAttempts: try settings(\.apnsMaxAttempts),
            retryDelays: broker.retryDelays,
            maximumDeliveries: try settings(\.workerMaxDeliveries),
            exitOnJobID: exitOnJobID)
    }

    /// A setting's name, for the messages that name another setting than their own.
    static func name(_ key: KeyPath<SettingTable, some SettingEntry>) -> String {
        SettingTable.shared[keyPath: key].name
    }
}
