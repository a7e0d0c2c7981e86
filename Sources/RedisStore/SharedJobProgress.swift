import Foundation
import JSON
import Redis
import Telemetry
import WorkerPipeline

/// Large jobs' progress, fleet-wide (the schema is in docs/contract.md, Job progress):
/// - `apns:job:<id>:progress`: hash; counters every worker running the job adds to (`resolved`, `sent`, `delivered`,
///   `dead`, `failed`, `held_back`, `expired`, `cancelled`), `retrying` (set as each attempt settles), `targets`
///   (the job's users and tokens, for the ETA), `first_update` (when a worker first counted something of it) and
///   `last_update` (ms), and `ended` (ms) once it
///   settled with nothing left to retry; kept 24 hours after the last update (a scheduled job's, after its send_at).
/// - `apns:jobs:running`: sorted set, member = job id, score = its last update (ms); a job leaves when it ends, or
///   24 hours after its last update (its worker died and no other took it).
public struct SharedJobProgress: JobProgressRecord {
    public static let retention = 24 * 3600

    private let redis: any RedisClient
    private let keys: RedisKeys

    public init(redis: any RedisClient) {
        self.redis = redis
        keys = RedisKeys(cluster: redis.isCluster)
    }

    /// How long a job's hash is kept from this update: 24 hours, and a job waiting for its `send_at` (up to 7 days
    /// ahead) until 24 hours after it, so that it shows scheduled all the while.
    static func retention(of delta: JobProgressDelta, now: Date) -> Int {
        guard let scheduledFor = delta.scheduledFor else { return retention }
        return retention + max(0, Int(scheduledFor - Int64(now.timeIntervalSince1970)))
    }

    public func add(_ deltas: [JobProgressDelta]) throws -> StoreAnswer<Void> {
        try add(deltas, now: Date())
    }

    public func add(_ deltas: [JobProgressDelta], now: Date) throws(RedisError) -> StoreAnswer<Void> {
        guard !deltas.isEmpty else { return .answered(()) }
        let milliseconds = String(Int64(now.timeIntervalSince1970 * 1000))
        var commands: [[String]] = []
        for delta in deltas {
            let key = keys.progress(delta.jobID)
            let runs = delta.since > 0 || delta.ended || delta.retrying != nil
            for (counter, value) in delta.counts where value != 0 {
                commands.append(["HINCRBY", key, counter.rawValue, String(value)])
            }
            if runs { commands.append(["HSETNX", key, "first_update", String(Int64(delta.since * 1000))]) }
            if delta.targets > 0 { commands.append(["HSETNX", key, "targets", String(delta.targets)]) }
            var set = ["HSET", key, "last_update", milliseconds]
            if let retrying = delta.retrying { set += ["retrying", String(retrying)] }
            if delta.ended { set += ["ended", milliseconds] }
            if let scheduledFor = delta.scheduledFor { set += ["scheduled_for", String(scheduledFor)] }
            if let cancelledAt = delta.cancelledAt { set += ["cancelled_at", String(Int64(cancelledAt * 1000))] }
            commands.append(set)
            commands.append(["EXPIRE", key, String(Self.retention(of: delta, now: now))])
            if let scheduledFor = delta.scheduledFor {
                commands.append(["ZADD", keys.scheduledJobs, String(scheduledFor * 1000), delta.jobID])
            }
            if let until = delta.windowsUntil {
                // Listed until its last part's hours open, whichever worker published which part first.
                commands.append(["ZADD", keys.scheduledJobs, "GT", String(until * 1000), delta.jobID])
            }
            if runs {
                if !delta.windowed { commands.append(["ZREM", keys.scheduledJobs, delta.jobID]) }
                commands.append(
                    delta.ended
                        ? ["ZREM", keys.runningJobs, delta.jobID]
                        : ["ZADD", keys.runningJobs, milliseconds, delta.jobID])
            }
        }
        commands.append([
            "ZREMRANGEBYSCORE", keys.scheduledJobs, "-inf",
            String(Int64(now.timeIntervalSince1970 * 1000) - Int64(Self.retention) * 1000)
        ])
        commands.append([
            "ZREMRANGEBYSCORE", keys.runningJobs, "-inf",
            String(Int64(now.timeIntervalSince1970 * 1000) - Int64(Self.retention) * 1000)
        ])
        let replies = try redis.pipelineWhereReachable(commands)
        if replies.contains(where: { $0 == nil }) { return .unavailable }
        for case .error(let message)? in replies { return .refused(message) }
        return .answered(())
    }

    /// What the fleet knows of a job: its progress, and whether it was cancelled.
    public func read(_ jobID: String, now: Date = Date()) throws(RedisError) -> JobProgressReport {
        let replies = try redis.pipeline([["HGETALL", keys.progress(jobID)], ["GET", keys.cancelled(jobID)]])
        for case .error(let message) in replies { throw RedisError(kind: .server, "reading job \(jobID): \(message)") }
        var fields: [String: String] = [:]
        let items = replies[0].elements
        var index = 0
        while index + 1 < items.count {
            if let name = items[index].text, let value = items[index + 1].text { fields[name] = value }
            index += 2
        }
        // A job cancelled under its other name (its message-id, or the id in its body) is known cancelled by the
        // record its worker wrote as it settled.
        let cancelledAt =
            replies[1].text.map { SharedCancellations.record($0).at }
            ?? fields["cancelled_at"].flatMap(Double.init).map { $0 / 1000 }
        return JobProgressReport(
            jobID: jobID, fields: fields, cancelled: cancelledAt != nil, cancelledAt: cancelledAt, now: now)
    }

    /// The jobs waiting for their `send_at`, soonest first, those past it that no worker started yet included.
    public func scheduled() throws(RedisError) -> [String] {
        let reply = try redis.command(["ZRANGEBYSCORE", keys.scheduledJobs, "-inf", "+inf"])
        if case .error(let message) = reply {
            throw RedisError(kind: .server, "reading \(keys.scheduledJobs): \(message)")
        }
        return reply.elements.compactMap(\.text)
    }

    /// The jobs running now (updated within `within` seconds), newest first.
    public func running(within seconds: Double = 60, now: Date = Date()) throws(RedisError) -> [String] {
        let since = Int64((now.timeIntervalSince1970 - seconds) * 1000)
        let reply = try redis.command(["ZREVRANGEBYSCORE", keys.runningJobs, "+inf", String(since)])
        if case .error(let message) = reply {
            throw RedisError(kind: .server, "reading \(keys.runningJobs): \(message)")
        }
        return reply.elements.compactMap(\.text)
    }
}

/// One job as `apns-worker jobs show` prints it.
public struct JobProgressReport: Sendable {
    public enum State: String, Sendable { case unknown, scheduled, running, done, cancelled }

    public var jobID: String
    public var state: State
    public var counts: [String: Int]
    public var targets: Int?
    public var ratePerSecond: Double
    public var etaSeconds: Double?
    public var updatedAt: Double?
    /// The job's `send_at`, if it waited for one.
    public var scheduledFor: Int64?

    /// The counters, in the order `--json` and the text give them: the workers' own, then the attempt's `retrying` and
    /// `waiting_for_window`.
    public static let counterNames =
        JobProgressDelta.Counter.allCases.filter { $0 != .waitingForWindow }.map(\.rawValue)
        + ["retrying", JobProgressDelta.Counter.waitingForWindow.rawValue]

    /// From the progress hash's fields as Redis holds them, and whether the job was cancelled (and when, UNIX
    /// seconds: a job that had ended before it was cancelled stays done).
    public init(
        jobID: String, fields: [String: String], cancelled: Bool, cancelledAt: Double? = nil, now: Date = Date()
    ) {
        self.jobID = jobID
        counts = Dictionary(uniqueKeysWithValues: Self.counterNames.map { ($0, Int(fields[$0] ?? "") ?? 0) })
        targets = fields["targets"].flatMap { Int($0) }
        let first = fields["first_update"].flatMap(Double.init).map { $0 / 1000 }
        let last = fields["last_update"].flatMap(Double.init).map { $0 / 1000 }
        updatedAt = last
        let endedAt = fields["ended"].flatMap(Double.init).map { $0 / 1000 }
        let ended = fields["ended"] != nil
        scheduledFor = fields["scheduled_for"].flatMap { Int64($0) }
        let started = fields["first_update"] != nil
        let waitingForWindow = counts["waiting_for_window"] ?? 0
        // A job that had ended before it was cancelled stays done: the cancellation only keeps its id from being sent.
        let endedBeforeCancelled = if let endedAt, let cancelledAt { endedAt < cancelledAt } else { false }
        if cancelled && !endedBeforeCancelled {
            state = .cancelled
        } else if waitingForWindow > 0 {
            // A windowed job is done only when no part waits for its users' hours any more.
            state = (counts["sent"] ?? 0) > 0 ? .running : .scheduled
        } else if ended {
            state = .done
        } else if scheduledFor != nil, !started {
            // Past its send_at too, until a worker starts it (none running, or a backlog before it).
            state = .scheduled
        } else {
            state = started ? .running : .unknown
        }
        let sent = Double(counts["sent"] ?? 0)
        // The rate of the job while it ran: what was sent by the last update, over the time since the first.
        if let first, let last, last - first > 0.2 { ratePerSecond = sent / (last - first) } else { ratePerSecond = 0 }
        if state == .running, waitingForWindow <= 0, let targets, ratePerSecond > 0 {
            let settledUnsent = (counts["cancelled"] ?? 0) + (counts["expired"] ?? 0)
            etaSeconds = max(0, Double(targets) - sent - Double(settledUnsent)) / ratePerSecond
        } else {
            etaSeconds = state == .done || state == .cancelled ? 0 : nil
        }
    }

    /// One object with exactly the names of `schema/job-progress.schema.json`.
    public var json: String {
        func number(_ value: Double?) -> String {
            guard let value else { return "null" }
            return String(format: "%.1f", value)
        }
        var text = "{\"job_id\":\(JSONString.quote(jobID)),\"state\":\"\(state.rawValue)\","
        text += "\"scheduled_for\":\(scheduledFor.map(String.init) ?? "null")"
        for name in Self.counterNames { text += ",\"\(name)\":\(counts[name] ?? 0)" }
        text += ",\"rate_per_second\":\(number(ratePerSecond)),\"eta_seconds\":\(number(etaSeconds))"
        text += ",\"updated_at\":\(number(updatedAt))}"
        return text
    }

    public var text: String {
        // The id is the publisher's, shown on a terminal.
        var lines = ["job \(Redact.printable(jobID)): \(state.rawValue)"]
        if state == .scheduled, (counts["waiting_for_window"] ?? 0) <= 0, let scheduledFor {
            lines.append(
                "  waits for its send_at: \(Date(timeIntervalSince1970: Double(scheduledFor)).formatted(.iso8601))")
            return lines.joined(separator: "\n")
        }
        if state == .unknown {
            lines.append(
                "  no progress recorded: the job has not started, ended more than 24 hours ago, or has fewer "
                    + "than \(JobProgressDelta.minimumTargets) users and tokens (its summary says how it went)")
            return lines.joined(separator: "\n")
        }
        let counted = Self.counterNames.map { "\($0.replacingOccurrences(of: "_", with: " ")) \(counts[$0] ?? 0)" }
        lines.append("  " + counted.joined(separator: ", "))
        var pace = String(format: "  %.0f/s", ratePerSecond)
        if let targets { pace += " of about \(targets) notifications" }
        if let etaSeconds, state == .running { pace += String(format: ", about %.0f s left", etaSeconds) }
        if let updatedAt { pace += "; updated \(Date(timeIntervalSince1970: updatedAt).formatted(.iso8601))" }
        lines.append(pace)
        return lines.joined(separator: "\n")
    }
}
