import APNs
import Configuration
import Telemetry

/// The broadcast channels of one app in one environment, through Apple's channel management API (`apns-worker
/// channels`): the credential that serves the app signs, the environment's channel management host answers, over one
/// connection opened at the first call. Calls block the calling thread (a command's).
public final class ChannelOperations {
    /// Why the operations cannot start.
    public enum Problem: Error, CustomStringConvertible {
        /// The credentials or the connection's settings do not load.
        case configuration(String)
        /// No credential serves the app.
        case noCredential(bundle: String)

        public var description: String {
            switch self {
            case .configuration(let text): "configuration error: \(text)"
            case .noCredential(let bundle): "no APNs credential serves \(bundle)"
            }
        }
    }

    /// The app's bundle ID (the topic without its push type's suffix).
    public let bundle: String
    public let environment: APNsEnvironment
    private let client: APNsChannelClient

    public init(
        configuration: WorkerConfiguration, topic: String, environment: APNsEnvironment,
        logger: Logger
    ) throws(Problem) {
        let credentials: APNsCredentials
        do { credentials = try configuration.credential.makeCredentials() } catch {
            throw .configuration(error.description)
        }
        let bundle = APNsPushType.bundle(ofTopic: topic)
        guard let credential = credentials.credential(forTopic: bundle) else { throw .noCredential(bundle: bundle) }
        let endpoint =
            environment == .production ? configuration.apns.channelsProduction : configuration.apns.channelsSandbox
        do {
            client = try APNsChannelClient(
                endpoint: endpoint, credential: credential, configuration: configuration.apns,
                logger: logger.child("channels"))
        } catch {
            throw .configuration("\(error)")
        }
        self.bundle = bundle
        self.environment = environment
    }

    /// A new channel: its id.
    public func create(storage: APNsChannelStorage) throws(APNsChannelError) -> String {
        try client.create(bundle: bundle, storage: storage)
    }

    /// Every channel id of the app.
    public func list() throws(APNsChannelError) -> [String] { try client.list(bundle: bundle) }

    /// How the channel keeps messages.
    public func show(_ channel: String) throws(APNsChannelError) -> APNsChannelStorage {
        try client.show(bundle: bundle, channel: channel)
    }

    public func delete(_ channel: String) throws(APNsChannelError) {
        try client.delete(bundle: bundle, channel: channel)
    }
}
