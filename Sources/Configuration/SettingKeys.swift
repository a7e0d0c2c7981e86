/// Every setting the programs read (config/apns-worker.env documents each, with its default), and what to say of a
/// name that is none of them: a typo such as APNS_RATELIMIT must not run silently with no limit at all.
public enum SettingKeys {
    public static let all: Set<String> = [
        "AMQP_URL", "AMQP_CA_FILE", "AMQP_HEARTBEAT", "REDIS_URL",
        "APNS_PRODUCTION_URL", "APNS_SANDBOX_URL", "APNS_CA_FILE", "APNS_KEY_FILE", "APNS_KEY_ID", "APNS_TEAM_ID",
        "APNS_CERT_FILE", "APNS_CERT_KEY_FILE", "APNS_TOPIC", "APNS_CONNECTIONS", "APNS_REQUEST_TIMEOUT",
        "APNS_PING_INTERVAL", "APNS_PING_TIMEOUT", "APNS_INSECURE_SKIP_VERIFY", "APNS_RATE_LIMIT", "APNS_RATE_LIMIT_URGENT_SHARE",
        "APNS_MAX_ATTEMPTS",
        "APNS_RETRY_DELAYS",
        "PUSH_JOBS_QUEUE", "PUSH_BULK_QUEUE", "PUSH_DEAD_TOKENS_QUEUE", "PUSH_DEAD_TOKENS_EXCHANGE", "PUSH_FAILED_QUEUE",
        "PUSH_REGISTRATIONS_QUEUE", "PUSH_QUEUE_TYPE",
        "WORKER_PREFETCH", "WORKER_BULK_PREFETCH", "WORKER_MAX_IN_FLIGHT", "WORKER_MASS_INVALIDATION_THRESHOLD",
        "WORKER_MAX_DELIVERIES",
        "SHUTDOWN_TIMEOUT", "METRICS_HOST", "METRICS_PORT", "LOG_LEVEL", "LOG_FORMAT",
        "CLEANUP_INACTIVE_DAYS", "CLEANUP_SWEEP_INTERVAL",
    ]

    /// Environment variables with these prefixes are meant for these programs: one that none of them reads is
    /// worth a warning (the environment holds much else, so nothing stops there).
    public static let prefixes = ["APNS_", "PUSH_", "WORKER_", "REDIS_", "AMQP_"]

    /// Keys given in a settings file or with `--set` must all be known: the first unknown one stops start-up,
    /// with the nearest known key suggested.
    public static func checkKnown(_ keys: some Sequence<String>, source: String) throws(ConfigurationError) {
        for key in keys.sorted() where !all.contains(key) {
            throw ConfigurationError(key: key, "unknown setting (\(source))" + suggestion(for: key))
        }
    }

    /// A warning per environment variable that looks meant for these programs but is read by none of them.
    public static func unknownInEnvironment(_ environment: [String: String]) -> [String] {
        environment.keys.sorted().filter { key in
            !all.contains(key) && prefixes.contains { key.hasPrefix($0) }
        }.map { "\($0) is set but no setting of that name exists" + suggestion(for: $0) }
    }

    public static func suggestion(for key: String) -> String {
        nearest(to: key).map { "; did you mean \($0)?" } ?? "; config/apns-worker.env lists every setting"
    }

    /// The known key closest to `key` by edit distance, if it is close enough to be a typo of it.
    static func nearest(to key: String) -> String? {
        let candidates = all.map { (key: $0, distance: editDistance(key.uppercased(), $0)) }
        guard let best = candidates.min(by: { ($0.distance, $0.key) < ($1.distance, $1.key) }) else { return nil }
        return best.distance <= max(2, key.count / 4) ? best.key : nil
    }

    /// Levenshtein distance.
    static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a.utf8), b = Array(b.utf8)
        var previous = Array(0...b.count)
        for (i, x) in a.enumerated() {
            var current = [i + 1] + Array(repeating: 0, count: b.count)
            for (j, y) in b.enumerated() {
                current[j + 1] = min(previous[j + 1] + 1, current[j] + 1, previous[j] + (x == y ? 0 : 1))
            }
            previous = current
        }
        return previous[b.count]
    }
}
