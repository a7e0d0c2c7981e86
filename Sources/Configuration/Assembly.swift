import AMQP
import AMQPBroker
import APNs
import APNsSender
import Foundation
import Redis
import RedisStore
import Telemetry
import WorkerPipeline

extension WorkerConfiguration {
    /// The worker as `apns-worker run` runs it: the pipeline over RabbitMQ (`AMQPJobBroker`) and Redis
    /// (`RedisStores`), one session of both per connection, sending with every credential. Reads the credentials,
    /// and logs what deserves it about the key files and certificates. `reload` reads the configuration again for a
    /// reload (SIGHUP); without it, the worker reloads nothing.
    public func makeWorker(logger: Logger, reload: (@Sendable () throws -> WorkerConfiguration)? = nil)
        throws(ConfigurationError) -> ReloadableWorker
    {
        let credentials = try credential.makeCredentials()
        ReloadableWorker.warnAbout(credential, credentials, logger: logger)
        if let choice = credential.choice { logger.warning("two APNs credentials", ["apns.credentials": choice]) }
        let sender = APNsNotificationSender(
            configuration: apns, credentials: credentials,
            logger: logger.child("apns-client"))
        let worker = makeWorker(sender: sender, logger: logger)
        let providerTokens = FleetProviderTokens(redis, logger: logger.child("provider-tokens")) {
            sender.currentCredentials.all.compactMap { credential in
                guard case .token(let provider) = credential.authentication else { return nil }
                return (provider, credential.shortFingerprint)
            }
        }
        return ReloadableWorker(worker: worker, sender: sender, providerTokens: providerTokens, logger: logger) {
            guard let reload else {
                throw ReloadRefused("this worker was started without a way to read its settings again")
            }
            let settings = try reload().credential
            let credentials = try settings.makeCredentials()
            ReloadableWorker.warnAbout(settings, credentials, logger: logger)
            return credentials
        }
    }

    private func makeWorker(sender: APNsNotificationSender, logger: Logger) -> Worker {
        let broker = self.broker
        let redis = self.redis
        let rateLimit = self.rateLimit
        let urgentShare = rateLimitUrgentShare
        let topology = DeclaredTopology()
        return Worker(settings: pipeline, sender: sender, logger: logger) {
            // Redis first: a worker that cannot reach it takes no job from the broker (each it took and handed back
            // would count as a delivery).
            let stores = try RedisStores(redis, rateLimit: rateLimit, urgentShare: urgentShare, logger: logger)
            let preparation = try RedisStores.preparation(redis, logger: logger)
            let amqp = try AMQPJobBroker(settings: broker, topology: topology, logger: logger)
            return WorkerSession(
                broker: amqp, tokens: stores.tokens, preparationTokens: preparation.tokens,
                preparationRecord: preparation.record, record: stores.record,
                statistics: stores.statistics, rateLimiter: stores.rateLimiter,
                invalidationWindow: stores.invalidationWindow,
                store: stores.probe,
                logMetadata: amqp.logMetadata.merging(["redis.url": redis.description]) { $1 },
                groupRateLimiter: stores.groupRateLimiter(urgentShare: urgentShare),
                cancellations: stores.cancellations, progress: stores.progress)
        }
    }
}

extension AMQPError: SystemFailure {
    public var failedSystem: ConnectionRefused.System { .broker }
}

extension RedisError: SystemFailure {
    public var failedSystem: ConnectionRefused.System { .store }
}

/// The worker, with what can change while it runs: its credentials, read again on SIGHUP (`reload`). The sender's
/// own series (connections per credential, certificate expiry) join the worker's in `/metrics`; certificates close
/// to their expiry are warned about at start, at each reload and once a day.
public final class ReloadableWorker: Service {
    public let worker: Worker
    public let sender: APNsNotificationSender
    /// The fleet's provider tokens, one per key, kept in Redis.
    private let providerTokens: FleetProviderTokens?
    private let logger: Logger
    private let readCredentials: @Sendable () throws -> APNsCredentials
    private let stopped = DispatchSemaphore(value: 0)

    /// Seconds between two looks at the certificates' expiry while the worker runs.
    static let expiryCheckInterval: Double = 86_400

    init(
        worker: Worker, sender: APNsNotificationSender, providerTokens: FleetProviderTokens? = nil, logger: Logger,
        readCredentials: @escaping @Sendable () throws -> APNsCredentials
    ) {
        self.providerTokens = providerTokens
        self.worker = worker
        self.sender = sender
        self.logger = logger
        self.readCredentials = readCredentials
    }

    public func run() throws {
        let stopped = self.stopped
        let sender = self.sender
        let logger = self.logger
        // Its own thread: it sleeps a day at a time, and a stop wakes it.
        Thread {
            while stopped.wait(timeout: .now() + Self.expiryCheckInterval) == .timedOut {
                Self.warnAboutExpiry(sender.currentCredentials, logger: logger)
            }
        }.start()
        defer { stopped.signal() }
        // Before the first push: every worker then sends with the fleet's token from its first request.
        providerTokens?.start()
        defer { providerTokens?.stop() }
        try worker.run()
    }

    public func stop() { worker.stop() }
    public var isReady: Bool { worker.isReady }
    public var metricsText: String { worker.metricsText + sender.metricsText }

    /// Reads the credentials again; what changed gets new connections, the old ones finish their streams and close.
    /// A reading that fails throws and changes nothing.
    public func reload() throws {
        let credentials = try readCredentials()
        let (added, retired) = sender.replaceCredentials(credentials)
        logger.info(
            "APNs credentials reloaded",
            [
                "apns.credentials": credentials.all.map(\.name).joined(separator: ","),
                "apns.credentials_added": added.joined(separator: ","),
                "apns.credentials_retired": retired.joined(separator: ",")
            ])
    }

    /// What deserves a line about freshly read credentials: key files others can read, certificates near expiry.
    static func warnAbout(_ settings: CredentialSettings, _ credentials: APNsCredentials, logger: Logger) {
        for problem in settings.privateKeyPermissionProblems() {
            logger.critical("the APNs private key is not private", ["file.problem": problem])
        }
        warnAboutExpiry(credentials, logger: logger)
    }

    static func warnAboutExpiry(_ credentials: APNsCredentials, logger: Logger) {
        for warning in CredentialSettings.certificateExpiryWarnings(credentials) {
            logger.warning(warning.message, warning.metadata)
        }
    }
}
