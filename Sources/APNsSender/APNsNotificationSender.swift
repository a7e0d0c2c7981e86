import APNs
import HTTP2
import Telemetry
import WorkerPipeline

/// The pipeline's sender port over `APNsClient`: each lane on connections and a loop thread of its own, answers on
/// the lane's thread, connection events turned into the pipeline's `ConnectionHealth`.
public final class APNsNotificationSender: NotificationSender {
    private let client: APNsClient
    /// Who hears of connection events: set once by `start`, read by the client's loop thread on each event.
    private let healthReport = Locked<(@Sendable (ConnectionHealth) -> Void)?>(nil)

    public init(configuration: APNsClientConfiguration, authentication: APNsAuthentication, logger: Logger) {
        var configuration = configuration
        let healthReport = self.healthReport
        let earlierObserver = configuration.observer
        configuration.observer = { environment, event in
            earlierObserver?(environment, event)
            guard let health = ConnectionHealth(event), let report = healthReport.withLock({ $0 }) else { return }
            report(health)
        }
        client = APNsClient(configuration: configuration, authentication: authentication, logger: logger)
    }

    /// Production connections open now: it is where nearly all traffic goes, and readiness waits for one.
    public func start(reportingHealth report: @escaping @Sendable (ConnectionHealth) -> Void) {
        healthReport.withLock { $0 = report }
        client.connect(.production)
    }

    public func send(_ batch: [OutgoingNotification], lane: JobLane,
                     answer: @escaping @Sendable (Int, APNsResult) -> Void) {
        client.send(batch, traffic: APNsTraffic(lane), completion: answer)
    }

    public func schedule(after delay: Double, lane: JobLane, _ action: @escaping @Sendable () -> Void) {
        client.schedule(after: delay, traffic: APNsTraffic(lane), action)
    }

    public func shutdown() { client.shutdown() }
}

extension APNsTraffic {
    init(_ lane: JobLane) { self = lane == .urgent ? .urgent : .bulk }
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
