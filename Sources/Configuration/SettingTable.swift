import AMQP
import AMQPBroker
import APNs
import Redis
import Telemetry

/// Every setting, each declared once: its name, the kind of value, its default, the programs that read it and its
/// help line. Loading reads these entries (`SettingValues`), the unknown-key check and the `--help` lists are made
/// from them, and a unit test holds config/apns-worker.env to them, key for key and default for default.
public struct SettingTable: Sendable {
    // The broker.
    public let amqpURL: Setting<AMQPNodes> = Setting(
        name: "AMQP_URL", kind: .brokerNodes, defaultValue: "amqp://guest:guest@127.0.0.1:5672/%2f",
        readers: .brokerClients,
        help: "the broker (user, password, host, port, vhost); a cluster's nodes comma-separated")
    public let amqpCAFile: OptionalSetting<String> = OptionalSetting(
        name: "AMQP_CA_FILE", kind: .caFile, unsetMeans: "/etc/ssl/certs/ca-certificates.crt", readers: .brokerClients,
        help: "CA bundle, PEM, for amqps://")
    public let amqpHeartbeat: Setting<Int> = Setting(
        name: "AMQP_HEARTBEAT", kind: .wholeNumber(0...3600), defaultValue: "5",
        readers: [.worker, .cleanup, .enqueue, .deadTokensTail],
        help: "heartbeat in seconds, 0: none; a silent connection is dropped after two missed beats, and the worker "
            + "leaves a node whose reply takes longer than one beat (5 s at least, 10 s at most)")

    // Redis.
    public let redisURL: Setting<RedisURL> = Setting(
        name: "REDIS_URL", kind: .redisURL, defaultValue: "redis://127.0.0.1:6379/0",
        readers: [.worker, .cleanup, .tokens, .stats],
        help: "token cache, rate limit and shared statistics")
    public let redisSentinels: OptionalSetting<[RedisAddress]> = OptionalSetting(
        name: "REDIS_SENTINELS", kind: .redisAddresses, unsetMeans: "none: REDIS_URL names the one node",
        readers: [.worker, .cleanup, .tokens, .stats],
        help: "Sentinel: the sentinels, host:port comma-separated; they name the master (REDIS_URL then holds only "
            + "the data nodes' password and database, redis://:password@/db)")
    public let redisMasterName: OptionalSetting<String> = OptionalSetting(
        name: "REDIS_MASTER_NAME", kind: .text, readers: [.worker, .cleanup, .tokens, .stats],
        help: "Sentinel: the master's name, as the sentinels' 'sentinel monitor' line gives it")
    public let redisClusterNodes: OptionalSetting<[RedisAddress]> = OptionalSetting(
        name: "REDIS_CLUSTER_NODES", kind: .redisAddresses, unsetMeans: "none: REDIS_URL names the one node",
        readers: [.worker, .cleanup, .tokens, .stats],
        help: "Redis Cluster: some of its nodes, host:port comma-separated, from which the slot map is learned "
            + "(REDIS_URL then holds only the nodes' password, redis://:password@)")
    public let redisSentinelPassword: OptionalSetting<String> = OptionalSetting(
        name: "REDIS_SENTINEL_PASSWORD", kind: .text, unsetMeans: "none", readers: [.worker, .cleanup, .tokens, .stats],
        help: "Sentinel: the sentinels' own password (their requirepass), if they require one")

    public let redisCAFile: OptionalSetting<String> = OptionalSetting(
        name: "REDIS_CA_FILE", kind: .caFile, unsetMeans: "the system trust store only",
        readers: [.worker, .cleanup, .tokens, .stats],
        help: "TLS (a rediss:// REDIS_URL): an extra trusted CA, PEM, for a private Redis CA")
    public let redisCertFile: OptionalSetting<String> = OptionalSetting(
        name: "REDIS_CERT_FILE", kind: .file, unsetMeans: "none", readers: [.worker, .cleanup, .tokens, .stats],
        help: "TLS: a client certificate, PEM, for Redis that requires one (tls-auth-clients)")
    public let redisCertKeyFile: OptionalSetting<String> = OptionalSetting(
        name: "REDIS_CERT_KEY_FILE", kind: .file, unsetMeans: "the key in REDIS_CERT_FILE",
        readers: [.worker, .cleanup, .tokens, .stats], help: "TLS: the client certificate's private key, PEM")

    // APNs: where, and with which credential.
    public let apnsProductionURL: Setting<APNsEndpoint> = Setting(
        name: "APNS_PRODUCTION_URL", kind: .endpoint, defaultValue: "https://api.push.apple.com:443", readers: .worker,
        help: "the production endpoint")
    public let apnsSandboxURL: Setting<APNsEndpoint> = Setting(
        name: "APNS_SANDBOX_URL", kind: .endpoint, defaultValue: "https://api.sandbox.push.apple.com:443",
        readers: .worker,
        help: "the sandbox endpoint")
    public let apnsChannelsProductionURL: Setting<APNsEndpoint> = Setting(
        name: "APNS_CHANNELS_PRODUCTION_URL", kind: .endpoint,
        defaultValue: "https://api-manage-broadcast.push.apple.com:2196", readers: .channels,
        help: "the production channel management endpoint (broadcast channels, iOS 18)")
    public let apnsChannelsSandboxURL: Setting<APNsEndpoint> = Setting(
        name: "APNS_CHANNELS_SANDBOX_URL", kind: .endpoint,
        defaultValue: "https://api-manage-broadcast.sandbox.push.apple.com:2195", readers: .channels,
        help: "the sandbox channel management endpoint")
    public let apnsProxyURL: OptionalSetting<APNsProxy> = OptionalSetting(
        name: "APNS_PROXY_URL", kind: .proxyURL, unsetMeans: "none: straight to APNs", readers: [.worker, .channels],
        help: "an HTTP proxy that opens CONNECT tunnels, for egress; TLS to APNs runs end to end inside the tunnel")
    public let apnsCAFile: OptionalSetting<String> = OptionalSetting(
        name: "APNS_CA_FILE", kind: .caFile, unsetMeans: "the system trust store only", readers: [.worker, .channels],
        help: "an extra trusted CA, PEM, for a private endpoint such as apns-sim")
    public let apnsKeyFile: OptionalSetting<String> = OptionalSetting(
        name: "APNS_KEY_FILE", kind: .file, readers: [.worker, .channels],
        help: "token authentication: Apple's .p8 signing key, with APNS_KEY_ID and APNS_TEAM_ID")
    public let apnsKeyID: OptionalSetting<String> = OptionalSetting(
        name: "APNS_KEY_ID", kind: .text, readers: [.worker, .channels], help: "the signing key's 10-character id")
    public let apnsTeamID: OptionalSetting<String> = OptionalSetting(
        name: "APNS_TEAM_ID", kind: .text, readers: [.worker, .channels], help: "the 10-character team id")
    public let apnsCertFile: OptionalSetting<String> = OptionalSetting(
        name: "APNS_CERT_FILE", kind: .file, readers: [.worker, .channels],
        help: "certificate authentication, PEM: the alternative to a signing key")
    public let apnsCertKeyFile: OptionalSetting<String> = OptionalSetting(
        name: "APNS_CERT_KEY_FILE", kind: .file, unsetMeans: "the key in APNS_CERT_FILE", readers: [.worker, .channels],
        help: "the certificate's private key, PEM")
    public let apnsCredentialsFile: OptionalSetting<String> = OptionalSetting(
        name: "APNS_CREDENTIALS_FILE", kind: .file, unsetMeans: "none: the one credential above serves every topic",
        readers: [.worker, .channels],
        help:
            "several teams' keys and certificates, JSON (docs/operations.md: Several apps and teams); a job's bundle id picks "
            + "the entry that lists it, the single-key settings serve the rest; re-read on SIGHUP")
    public let apnsTopic: OptionalSetting<String> = OptionalSetting(
        name: "APNS_TOPIC", kind: .topic, unsetMeans: "none: such jobs are refused",
        readers: [.worker, .enqueue, .tokens, .cleanup, .channels],
        help: "the app's bundle id, the topic of jobs that name none")

    // Queues.
    public let pushJobsQueue: Setting<String> = Setting(
        name: "PUSH_JOBS_QUEUE", kind: .brokerName, defaultValue: "push.jobs", readers: [.worker, .enqueue, .stats],
        help: "jobs in: the urgent lane")
    public let pushBulkQueue: Setting<String> = Setting(
        name: "PUSH_BULK_QUEUE", kind: .brokerName, defaultValue: "push.bulk", readers: [.worker, .enqueue, .stats],
        help: "jobs in: the bulk lane, served after urgent work")
    public let pushDeadTokensQueue: Setting<String> = Setting(
        name: "PUSH_DEAD_TOKENS_QUEUE", kind: .brokerName, defaultValue: "push.dead-tokens",
        readers: [.worker, .cleanup, .stats, .deadTokensTail], help: "dead-token events out, for cleanup")
    public let pushFailedQueue: Setting<String> = Setting(
        name: "PUSH_FAILED_QUEUE", kind: .brokerName, defaultValue: "push.failed", readers: [.worker, .cleanup, .stats],
        help: "what cannot be sent or read, body kept, reason attached")
    public let pushDeadTokensExchange: OptionalSetting<String> = OptionalSetting(
        name: "PUSH_DEAD_TOKENS_EXCHANGE", kind: .brokerName, unsetMeans: "the dead-token queue's name",
        readers: [.worker, .cleanup, .deadTokensTail],
        help: "fanout exchange dead-token events are published to; empty: straight to the queue")
    public let pushRegistrationsQueue: Setting<String> = Setting(
        name: "PUSH_REGISTRATIONS_QUEUE", kind: .brokerName, defaultValue: "push.registrations",
        readers: [.cleanup, .stats],
        help: "registration events (an app reporting its token) that cleanup applies")
    public let pushQueueType: OptionalSetting<QueueType> = OptionalSetting(
        name: "PUSH_QUEUE_TYPE", kind: .queueType,
        unsetMeans: "quorum when AMQP_URL lists several nodes, classic for one",
        readers: [.worker, .cleanup, .enqueue, .deadTokensTail],
        help: "the type of every queue the programs declare; one that exists is used as it is")

    // Rate.
    public let apnsRateLimit: Setting<Int> = Setting(
        name: "APNS_RATE_LIMIT", kind: .wholeNumber(0...10_000_000), defaultValue: "0", readers: .worker,
        help: "notifications per second shared by all workers on the same Redis; 0: no limit")
    public let apnsRateLimitUrgentShare: Setting<Double> = Setting(
        name: "APNS_RATE_LIMIT_URGENT_SHARE", kind: .fraction, defaultValue: "0.2", readers: .worker,
        help: "the share of the rate limit urgent work can always take at once")

    // The worker's tuning.
    public let workerPrefetch: Setting<Int> = Setting(
        name: "WORKER_PREFETCH", kind: .wholeNumber(1...65_535), defaultValue: "500", readers: .worker,
        help: "urgent jobs one worker holds unacknowledged")
    public let workerBulkPrefetch: Setting<Int> = Setting(
        name: "WORKER_BULK_PREFETCH", kind: .wholeNumber(1...65_535), defaultValue: "100", readers: .worker,
        help: "bulk jobs one worker holds unacknowledged")
    public let workerBulkPrefetchBytes: Setting<Int> = Setting(
        name: "WORKER_BULK_PREFETCH_BYTES", kind: .wholeNumber(1...1 << 30), defaultValue: "2097152", readers: .worker,
        help: "bytes of bulk jobs (their bodies) one worker aims to hold unacknowledged: the bulk prefetch is as many "
            + "as fit at the size of the bodies seen lately, at most WORKER_BULK_PREFETCH, at least one")
    public let workerBulkAdmissionBytes: Setting<Int> = Setting(
        name: "WORKER_BULK_ADMISSION_BYTES", kind: .wholeNumber(1...1 << 30), defaultValue: "4194304", readers: .worker,
        help: "bytes of large bulk jobs (their bodies) one worker runs at once; the next waits until they settle, one "
            + "always runs")
    public let workerBulkAdmissionTargets: Setting<Int> = Setting(
        name: "WORKER_BULK_ADMISSION_TARGETS", kind: .wholeNumber(1...100_000_000), defaultValue: "200000",
        readers: .worker,
        help: "users and tokens of large bulk jobs one worker runs at once; the next waits until they "
            + "settle, one always runs")
    public let workerMaxInFlight: Setting<Int> = Setting(
        name: "WORKER_MAX_IN_FLIGHT", kind: .wholeNumber(2...1_000_000), defaultValue: "5000", readers: .worker,
        help: "notifications sent to APNs and not answered yet, per lane, at most: no more than the lane's connections "
            + "can carry (APNS_MAX_CONNECTIONS x the streams APNs allows) plus 256")
    public let workerMassInvalidationThreshold: Setting<Int> = Setting(
        name: "WORKER_MASS_INVALIDATION_THRESHOLD", kind: .wholeNumber(1...1_000_000), defaultValue: "20",
        readers: .worker,
        help: "this many bad-token answers (400 mismatches), in one job or across the fleet's last minute or hour, "
            + "over WORKER_MASS_INVALIDATION_SHARE of the answers that judge a token, remove no token")
    public let workerMassInvalidationShare: Setting<Double> = Setting(
        name: "WORKER_MASS_INVALIDATION_SHARE", kind: .fraction, defaultValue: "0.1", readers: [.worker, .stats],
        help: "the share of token-judging answers (200, 410, 400 mismatch) that bad-token answers must exceed to be "
            + "held back")
    public let workerMaxDeliveries: Setting<Int> = Setting(
        name: "WORKER_MAX_DELIVERIES", kind: .wholeNumber(1...1_000), defaultValue: "5", readers: .worker,
        help: "deliveries of one job at most, then it is parked as a poison job")
    public let apnsConnections: Setting<Int> = Setting(
        name: "APNS_CONNECTIONS", kind: .wholeNumber(1...64), defaultValue: "2", readers: .worker,
        help: "HTTP/2 connections per APNs environment and lane")
    public let apnsMaxConnections: Setting<Int> = Setting(
        name: "APNS_MAX_CONNECTIONS", kind: .wholeNumber(1...256), defaultValue: "8", readers: .worker,
        help: "HTTP/2 connections at most per credential, APNs environment and lane: while every stream is busy and "
            + "notifications wait, more open, up to this (at least APNS_CONNECTIONS; left unset, APNS_CONNECTIONS if "
            + "that is larger); those above APNS_CONNECTIONS close after a minute idle")
    public let apnsRequestTimeout: Setting<Double> = Setting(
        name: "APNS_REQUEST_TIMEOUT", kind: .seconds, defaultValue: "30", readers: [.worker, .channels],
        help: "how long one notification may wait for APNs's answer, queueing included")
    public let apnsPingInterval: Setting<Double> = Setting(
        name: "APNS_PING_INTERVAL", kind: .seconds, defaultValue: "3600", readers: .worker,
        help: "PING a connection after this long without a frame from APNs")
    public let apnsPingTimeout: Setting<Double> = Setting(
        name: "APNS_PING_TIMEOUT", kind: .seconds, defaultValue: "15", readers: .worker,
        help: "a PING unanswered this long replaces the connection")
    public let apnsMaxAttempts: Setting<Int> = Setting(
        name: "APNS_MAX_ATTEMPTS", kind: .wholeNumber(1...100), defaultValue: "3", readers: .worker,
        help: "attempts at a notification APNs asked to retry before it is parked")
    public let apnsRetryDelays: Setting<[Double]> = Setting(
        name: "APNS_RETRY_DELAYS", kind: .secondsList, defaultValue: "1,15,60,300", readers: [.worker, .stats],
        help: "how long retry n waits (the last repeats), one delay queue each per lane")
    public let apnsInsecureSkipVerify: Setting<Bool> = Setting(
        name: "APNS_INSECURE_SKIP_VERIFY", kind: .flag, defaultValue: "false", readers: [.worker, .channels],
        help: "turn TLS verification of APNs off: tests only, logged as critical")
    public let shutdownTimeout: Setting<Double> = Setting(
        name: "SHUTDOWN_TIMEOUT", kind: .seconds, defaultValue: "25", readers: .worker,
        help: "on SIGTERM, how long to finish the jobs under way")

    // Operations.
    public let metricsHost: Setting<String> = Setting(
        name: "METRICS_HOST", kind: .text, defaultValue: "0.0.0.0", readers: [.worker, .cleanup],
        help: "the address of GET /metrics, /healthz and /readyz")
    public let metricsPort: OptionalSetting<Int> = OptionalSetting(
        name: "METRICS_PORT", kind: .wholeNumber(0...65_535),
        unsetMeans: "9464, or a free port when another process on the host holds 9464 (logged)",
        readers: [.worker, .cleanup], help: "their port; 0 turns them off; a port set and taken stops start-up")
    /// The port the endpoints take when METRICS_PORT is not set, if it is free.
    public static let defaultMetricsPort = 9464
    public let logLevel: Setting<Logger.Level> = Setting(
        name: "LOG_LEVEL", kind: .logLevel, defaultValue: "info", readers: .all,
        help: "the least severe log line written")
    public let logFormat: Setting<Logger.Format> = Setting(
        name: "LOG_FORMAT", kind: .logFormat, defaultValue: "json", readers: .all,
        help: "json (one object per line) or text")

    // apns-worker cleanup.
    public let cleanupInactiveDays: Setting<Int> = Setting(
        name: "CLEANUP_INACTIVE_DAYS", kind: .wholeNumber(1...3650), defaultValue: "90", readers: .cleanup,
        help: "tokens no app registered for this many days are swept")
    public let cleanupSweepInterval: Setting<Double> = Setting(
        name: "CLEANUP_SWEEP_INTERVAL", kind: .seconds, defaultValue: "3600", readers: .cleanup,
        help: "time between two sweeps of inactive tokens")

    public init() {}

    static let shared = SettingTable()

    /// Every entry, in the order declared above. Read from the table itself, so that no entry is declared once and
    /// then forgotten in a second list.
    public static let entries: [any SettingEntry] = Mirror(reflecting: shared).children.compactMap {
        $0.value as? any SettingEntry
    }

    /// The settings most deployments set, for `apns-worker --help`.
    /// Where the fleet's Redis is: what the commands that only talk to Redis read.
    public static var redisSettings: [any SettingEntry] {
        entries.filter { $0.name.hasPrefix("REDIS_") && $0.readers.contains(.tokens) }
    }

    public static let essentials: [any SettingEntry] = [
        shared.amqpURL, shared.redisURL, shared.apnsKeyFile, shared.apnsKeyID, shared.apnsTeamID, shared.apnsCertFile,
        shared.apnsTopic, shared.apnsRateLimit
    ]
}
