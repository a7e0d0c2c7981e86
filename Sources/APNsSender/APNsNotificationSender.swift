import APNs
import HTTP2
import Telemetry
import Threads
import WorkerPipeline

/// The pipeline's sender port over `APNsClient`: each lane on connections and a loop thread of its own, answers on
/// the lane's thread, connection events turned into the pipeline's `ConnectionHealth`. The pipeline asks it about
/// topics; which credential sends them stays in here.
public final class APNsNotificationSender: NotificationSender {
    private let client: APNsClient
    /// Who hears of connection events: set once by `start`, read by the client's loop thread on each event.
    private let healthReport = Locked<(@Sendable (ConnectionHealth) -> Void)?>(nil)

    public init(configuration: APNsClientConfiguration, credentials: APNsCredentials, logger: Logger) {
        var configuration = configuration
        let healthReport = self.healthReport
        let earlierObserver = configuration.observer
        configuration.observer = { environment, event in
            earlierObserver?(environment, event)
            guard let health = ConnectionHealth(event), let report = healthReport.withLock({ $0 }) else { return }
            report(health)
        }
        client = APNsClient(configuration: configuration, credentials: credentials, logger: logger)
    }

    /// Production connections of every credential open now: it is where nearly all traffic goes, no credential's
    /// first push waits for a handshake, and readiness waits for one.
    public func start(reportingHealth report: @escaping @Sendable (ConnectionHealth) -> Void) {
        healthReport.withLock { $0 = report }
        client.connect(.production)
    }

    public func send(
        _ batch: [APNsNotification], lane: JobLane,
        answer: @escaping @Sendable (Int, APNsResult) -> Void
    ) -> Int {
        client.send(batch, traffic: lane, completion: answer)
    }

    public func send(
        _ broadcast: APNsBroadcast, environment: APNsEnvironment, lane: JobLane,
        answer: @escaping @Sendable (APNsResult) -> Void
    ) {
        client.send(broadcast, environment: environment, traffic: lane, completion: answer)
    }

    public func isOnLaneThread(_ lane: JobLane) -> Bool { client.isOnLoopThread(of: lane) }

    public func streamCapacity(_ lane: JobLane) -> Int? { client.streamCapacity(lane) }

    public func schedule(after delay: Double, lane: JobLane, _ action: @escaping @Sendable () -> Void) {
        client.schedule(after: delay, traffic: lane, action)
    }

    public func service(forTopic topic: String) -> TopicService {
        guard let credential = client.credential(forTopic: topic) else {
            return .unserved(
                "no APNs credential serves topic \(topic): list its bundle ID "
                    + "(\(APNsPushType.bundle(ofTopic: topic))) in an entry of the credentials file, or set a "
                    + "default credential")
        }
        return .served(
            rateGroup: credential.rateLimit > 0
                ? RateGroup(name: credential.name, perSecond: credential.rateLimit) : nil)
    }

    /// Sends with these credentials from now on (a reload): see `APNsClient.replaceCredentials`.
    @discardableResult
    public func replaceCredentials(_ credentials: APNsCredentials) -> (added: [String], retired: [String]) {
        let changes = client.replaceCredentials(credentials)
        // The credentials added open their production connections now, not at their first push.
        client.connect(.production)
        return changes
    }

    public var currentCredentials: APNsCredentials { client.currentCredentials }

    public func shutdown() { client.shutdown() }

    public func takeSendingPools() -> Set<SendingPool> {
        Set(client.takeSendingPools().map { SendingPool(credential: $0.credential, environment: $0.environment) })
    }

    /// On the urgent lane: the bulk lane's connections open at its first job, where a handshake's wait matters less.
    public func open(_ pools: [SendingPool]) {
        for pool in pools { client.connect(credentialNamed: pool.credential, pool.environment, .urgent) }
    }

    /// The sender's own series: open connections and streams in use per credential, environment and lane, and when
    /// each client certificate expires, by the topics it serves.
    public var metricsText: String {
        var text = PrometheusText()
        text.family(
            "apns_worker_apns_connections_open", "gauge",
            "HTTP/2 connections to APNs open now, by credential, environment and lane.",
            Self.series(client.connectionCounts))
        text.family(
            "apns_worker_apns_streams_in_use", "gauge",
            "HTTP/2 streams to APNs carrying a request (each connection up to its stream limit), by credential, "
                + "environment and lane, sampled every second.",
            Self.series(client.streamsInUse))
        text.family(
            "apns_worker_provider_tokens_minted_total", "counter",
            "Provider tokens (JWT) this worker signed; with Redis, the fleet shares one per key, so most workers "
                + "sign none.", [([], APNsTokenProvider.minted.load(ordering: .relaxed))])
        var expiries: [(labels: [(String, String)], value: Int)] = []
        let credentials = client.currentCredentials
        for credential in credentials.all {
            guard let expiry = credential.certificateExpiry else { continue }
            let topics = credential.bundles.isEmpty ? [credentials.defaultTopic ?? ""] : credential.bundles.sorted()
            for topic in topics {
                expiries.append((labels: [("topic", topic)], value: Int(expiry.timeIntervalSince1970)))
            }
        }
        if !expiries.isEmpty {
            text.family(
                "apns_worker_certificate_expiry_timestamp_seconds", "gauge",
                "When the APNs client certificate expires (unix seconds), by the topic it serves.", expiries)
        }
        return text.text
    }
}

extension APNsNotificationSender {
    /// Per-pool counts as series, in a stable order.
    private static func series(_ counts: [APNsClient.ConnectionLabels: Int]) -> [(
        labels: [(String, String)], value: Int
    )] {
        counts.sorted {
            ($0.key.credential, $0.key.environment.rawValue, $0.key.traffic.rawValue)
                < ($1.key.credential, $1.key.environment.rawValue, $1.key.traffic.rawValue)
        }
        .map {
            (
                labels: [
                    ("credential", $0.key.credential), ("environment", $0.key.environment.rawValue),
                    ("lane", $0.key.traffic.rawValue)
                ],
                value: $0.value
            )
        }
    }
}

extension ConnectionHealth {
    /// nil for what is no news of a connection's health (a ping answered).
    init?(_ event: HTTP2ClientEvent) {
        switch event {
        case .opened: self = .opened
        case .closed: self = .closed
        case .goAway: self = .goAway
        case .connectFailed: self = .connectFailed
        case .pingAcknowledged: return nil
        }
    }
}
