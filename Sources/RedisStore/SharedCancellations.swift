import Foundation
import JSON
import Redis
import Telemetry
import WorkerPipeline

/// Cancelled jobs, fleet-wide (the schema is in docs/contract.md):
/// - `apns:cancelled:<job id>`: string, JSON `{"reason": ..., "at": <UNIX seconds>}`; kept 7 days.
/// - `apns:cancellations`: sorted set, member = job id, score = when it was cancelled (ms); what is older than 7 days
///   goes at the next cancellation. Workers read it from where they last stopped, so that learning of new
///   cancellations costs one read however many jobs run.
public struct SharedCancellations: JobCancellations {
    private let redis: any RedisClient
    private let keys: RedisKeys

    public init(redis: any RedisClient) {
        self.redis = redis
        keys = RedisKeys(cluster: redis.isCluster)
    }

    /// Records that `jobID` is cancelled, and why. Cancelling a job again keeps the first reason and time.
    public func cancel(_ jobID: String, reason: String?, now: Date = Date()) throws(RedisError) {
        let milliseconds = Int64(now.timeIntervalSince1970 * 1000)
        var record = "{\"at\":\(String(format: "%.3f", now.timeIntervalSince1970))"
        if let reason { record += ",\"reason\":\(JSONString.quote(reason))" }
        record += "}"
        let replies = try redis.pipeline([
            ["SET", keys.cancelled(jobID), record, "NX", "EX", String(CancelledJob.retention)],
            ["ZADD", keys.cancellations, "NX", String(milliseconds), jobID],
            [
                "ZREMRANGEBYSCORE", keys.cancellations, "-inf",
                String(milliseconds - Int64(CancelledJob.retention) * 1000)
            ]
        ])
        for case .error(let message) in replies {
            throw RedisError(kind: .server, "recording the cancellation of \(jobID): \(message)")
        }
    }

    /// When `jobID` was cancelled and why, if it was.
    public func cancellation(of jobID: String) throws(RedisError) -> (at: Double, reason: String?)? {
        let reply = try redis.command(["GET", keys.cancelled(jobID)])
        if case .error(let message) = reply {
            throw RedisError(kind: .server, "reading \(keys.cancelled(jobID)): \(message)")
        }
        return reply.text.map(Self.record)
    }

    /// A cancellation's record (`apns:cancelled:<job id>`): when (UNIX seconds; 0 if unreadable) and why.
    static func record(_ text: String) -> (at: Double, reason: String?) {
        let object = (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any]
        return ((object?["at"] as? Double) ?? 0, object?["reason"] as? String)
    }

    public func cancelled(since: Double?) throws -> StoreAnswer<[CancelledJob]> {
        let minimum = since.map { String(Int64(($0 * 1000).rounded(.down))) } ?? "-inf"
        guard
            let reply = try redis.commandWhereReachable([
                "ZRANGEBYSCORE", keys.cancellations, minimum, "+inf",
                "WITHSCORES"
            ])
        else { return .unavailable }
        if case .error(let message) = reply { return .refused(message) }
        let items = reply.elements
        var jobs: [CancelledJob] = []
        var index = 0
        while index + 1 < items.count {
            if let id = items[index].text, let score = Double(items[index + 1].text ?? "") {
                jobs.append(CancelledJob(jobID: id, at: score / 1000))
            }
            index += 2
        }
        return .answered(jobs)
    }
}
