import APNs
import Configuration
import Foundation
import JSON
import Redis
import RedisStore
import Telemetry
import WorkerPipeline

/// `apns-worker tokens`: the Redis token cache read and changed by hand, as a registration or a logout would change
/// it. Each action returns what to show; tokens are shortened (first 8 characters and length) unless `fullTokens`.
public final class TokenCacheEditor {
    /// Redis took the command but refused the change: someone else's data under these keys.
    public struct RefusedChange: Error, Sendable, CustomStringConvertible {
        public let message: String
        public var description: String { "Redis refused the change (another system wrote these keys?): \(message)" }
    }

    private let cache: TokenCache
    private let defaultTopic: String?
    private let fullTokens: Bool

    public init(configuration: WorkerConfiguration, fullTokens: Bool, logger: Logger) throws(RedisError) {
        cache = TokenCache(redis: try configuration.redis.connect(), logger: logger)
        defaultTopic = configuration.credential.defaultTopic
        self.fullTokens = fullTokens
    }

    /// The token belongs to `user` from now on, registered now (taken from another user who had it).
    /// With `activity`: a Live Activity's update token, kept under the activity.
    public func add(
        user: String, token written: String, scope: TokenScope, deviceJSON: String?,
        activity: String? = nil, timeZone: String? = nil
    ) throws -> String {
        let token = APNsNotification.canonicalToken(written)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let change = try cache.register([
            TokenRegistration(
                user: user, token: token, scope: scope, registeredAt: now,
                deviceJSON: deviceJSON, activity: activity, timeZone: timeZone)
        ])
        if case .failed(let message)? = change.first { throw RefusedChange(message: message) }
        let zone = timeZone.map { change.first == .applied ? ", time zone \($0)" : ", time zone unchanged" } ?? ""
        return "added \(shown(token)) for \(activity.map { "activity \($0)" } ?? user) (\(scope.cacheValue))" + zone
    }

    /// The token no longer receives `user`'s notifications; with a topic or an environment, only if the cached token
    /// serves it, so that a token of another kind is never removed by mistake.
    public func remove(user: String, token: String, topic: String?, environment: APNsEnvironment?) throws -> String {
        var servedValues: [String]?
        if let topic {
            let matcher = TopicMatcher(topic: topic, defaultTopic: defaultTopic)
            servedValues = (environment.map { [$0] } ?? APNsEnvironment.allCases).flatMap(matcher.cacheValues(in:))
        } else if let environment {
            servedValues = [environment.rawValue]
        }
        let removed = try cache.remove([TokenRemoval(user: user, token: token, onlyIfValueIn: servedValues)])
        if case .failed(let message)? = removed.first { throw RefusedChange(message: message) }
        if removed.first == .unavailable {
            throw RedisError(
                kind: .connectionLost, "the Redis node holding \(user)'s tokens does not answer: nothing removed")
        }
        if removed.first == .applied { return "removed \(shown(token)) from \(user)" }
        if servedValues != nil, let entry = try cache.entries(forUser: user).first(where: { $0.token == token }) {
            return "\(user)'s token \(shown(token)) serves \(entry.value), not \(topic ?? "the default app") in "
                + "\(environment.map(\.rawValue) ?? "either environment"): kept"
        }
        return "\(user) had no token \(shown(token))"
    }

    /// What `tokens import` did.
    public struct ImportReport: Sendable, Equatable {
        public var lines = 0
        public var applied = 0
        /// Older than what the cache knows, or a logout of a token already gone.
        public var unchanged = 0
        public var refused = 0
        /// The first refusals: line number and reason.
        public var firstRefusals: [String] = []
        /// Bytes read, and the input's size when it is a file.
        public var bytesRead = 0
        public var totalBytes: Int?

        mutating func refuse(line: Int, _ reason: String) {
            refused += 1
            if firstRefusals.count < 20 { firstRefusals.append("line \(line): \(reason)") }
        }
    }

    /// Applies registration events (one JSON object per line, as on PUSH_REGISTRATIONS_QUEUE, `-` for standard
    /// input) as the cleanup consumer would: a registration older than what the cache knows changes nothing, so a
    /// file can be imported again. `batch` events per round of Redis round trips; `progress` after each round.
    public func importRegistrations(
        path: String, batch: Int = 1_000,
        progress: (ImportReport) -> Void
    ) throws -> ImportReport {
        var reader = try JobReader(path: path, lineLimit: RegistrationEvent.maximumSize)
        var report = ImportReport(totalBytes: reader.totalBytes)
        var pending: [(line: Int, event: RegistrationEvent)] = []
        func flush() throws {
            var changes = RegistrationChanges()
            for item in pending { changes.append(item.event) }
            for (item, change) in zip(pending, try changes.apply(to: cache)) {
                switch change {
                case .applied: report.applied += 1
                case .unchanged: report.unchanged += 1
                case .failed(let message): report.refuse(line: item.line, "Redis refused it: \(message)")
                case .unavailable:
                    report.refuse(line: item.line, "its Redis node did not answer: import the file again")
                }
            }
            pending.removeAll(keepingCapacity: true)
            report.bytesRead = reader.bytesRead
            progress(report)
        }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        while let entry = try reader.next() {
            report.lines += 1
            switch entry {
            case .overLimit(let line):
                report.refuse(line: line, "longer than \(RegistrationEvent.maximumSize) bytes")
            case .job(let line, let body):
                do throws(JobError) { pending.append((line, try RegistrationEvent.decode(body, now: now))) } catch {
                    report.refuse(line: line, error.description)
                }
            }
            if pending.count >= batch { try flush() }
        }
        try flush()
        return report
    }

    /// `user`'s keys and where each lives (in a cluster: its slot and master), a line each.
    public func keys(user: String) -> String {
        cache.keys(forUser: user).map { "\($0.key)  \($0.location)" }.joined(separator: "\n")
    }

    /// `user`'s tokens (with a topic, only those a job with that topic reaches), as a table or as JSON.
    public func list(user: String, topic: String?, json: Bool) throws -> String {
        var entries = try cache.entries(forUser: user)
        if let topic {
            let matcher = TopicMatcher(topic: topic, defaultTopic: defaultTopic)
            entries.removeAll { entry in !(entry.scope.map(matcher.serves) ?? false) }
        }
        return json ? listJSON(entries) : listText(entries, user: user)
    }

    private func listText(_ entries: [TokenEntry], user: String) -> String {
        guard !entries.isEmpty else { return "\(user) has no tokens" }
        let now = Date()
        let topics = entries.map { entry -> String in
            guard let scope = entry.scope else { return "(unreadable: \(entry.value.prefix(40)))" }
            return scope.topic ?? (defaultTopic.map { "\($0) (default app)" } ?? "(default app)")
        }
        let tokenWidth = fullTokens ? 65 : 20
        let topicWidth = max(6, topics.map(\.count).max() ?? 0) + 2
        var lines = [
            "TOKEN".padding(toLength: tokenWidth, withPad: " ", startingAt: 0) + "ENVIRONMENT  "
                + "TOPIC".padding(toLength: topicWidth, withPad: " ", startingAt: 0)
                + "LAST REGISTERED (UTC)      DEVICE"
        ]
        let formatter = ISO8601DateFormatter()
        for (entry, topic) in zip(entries, topics) {
            var registered = "unknown"
            if let at = entry.registeredAt {
                let date = Date(timeIntervalSince1970: Double(at) / 1000)
                registered = formatter.string(from: date) + " (\(Int(now.timeIntervalSince(date) / 86_400)) d)"
            }
            let environment = entry.scope?.environment.rawValue ?? "-"
            lines.append(
                shown(entry.token).padding(toLength: tokenWidth, withPad: " ", startingAt: 0)
                    + environment.padding(toLength: 13, withPad: " ", startingAt: 0)
                    + topic.padding(toLength: topicWidth, withPad: " ", startingAt: 0)
                    + registered.padding(toLength: 27, withPad: " ", startingAt: 0) + (entry.deviceJSON ?? ""))
        }
        return lines.joined(separator: "\n")
    }

    /// `topic` is null for a device token of the default app; `value` is the cache value as stored.
    private func listJSON(_ entries: [TokenEntry]) -> String {
        "["
            + entries.map { entry in
                "{\"token\":\(JSONString.quote(shown(entry.token))),"
                    + "\"environment\":\(entry.scope.map { JSONString.quote($0.environment.rawValue) } ?? "null"),"
                    + "\"topic\":\(entry.scope?.topic.map(JSONString.quote) ?? "null"),\"value\":\(JSONString.quote(entry.value)),"
                    + "\"registered_at\":\(entry.registeredAt.map(String.init) ?? "null"),"
                    + "\"device\":\(entry.deviceJSON.map(Self.jsonOrText) ?? "null")}"
            }.joined(separator: ",") + "]"
    }

    /// Device metadata as the cache holds it: as it is if it is JSON (what registrations write), else as a string (what
    /// another system may have written), so that the listing stays JSON either way.
    private static func jsonOrText(_ stored: String) -> String {
        let isJSON = (try? JSONReader.check(Array(stored.utf8), allowsDuplicateKeys: true)) != nil
        return isJSON ? stored : JSONString.quote(stored)
    }

    /// A token as people see it: shortened unless they asked for it whole.
    private func shown(_ token: String) -> String { fullTokens ? token : Redact.token(token) }
}
