/// What to say of a name that is no setting of `SettingTable`: a typo such as APNS_RATELIMIT must not run silently
/// with no limit at all.
public enum SettingKeys {
    /// Every setting's name.
    public static let all = Set(SettingTable.entries.map(\.name))

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
        let a = Array(a.utf8)
        let b = Array(b.utf8)
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
