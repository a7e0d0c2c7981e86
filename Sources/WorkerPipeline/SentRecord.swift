import Redis

/// The idempotency record: per job, the tokens whose notification already had a final outcome, in a Redis set
/// `apns:job:<job id>:done` that lives an hour. Written in batches while a job is under way; read only for
/// redelivered jobs, so that a worker crash costs few or no duplicate pushes.
public struct SentRecord {
    public static func key(forJob id: String) -> String { "apns:job:" + id + ":done" }
    public static let lifetime = 3600

    private let redis: RedisConnection

    public init(redis: RedisConnection) { self.redis = redis }

    public func record(_ batches: [(jobID: String, tokens: [String])]) throws(RedisError) {
        var commands: [[String]] = []
        for batch in batches where !batch.tokens.isEmpty {
            commands.append(["SADD", Self.key(forJob: batch.jobID)] + batch.tokens)
            commands.append(["EXPIRE", Self.key(forJob: batch.jobID), String(Self.lifetime)])
        }
        guard !commands.isEmpty else { return }
        for reply in try redis.pipeline(commands) {
            if case .error(let message) = reply { throw RedisError(kind: .server, "idempotency record: \(message)") }
        }
    }

    /// For each job, the tokens already done; one round trip for all.
    public func sent(jobIDs: [String]) throws(RedisError) -> [String: Set<String>] {
        guard !jobIDs.isEmpty else { return [:] }
        let replies = try redis.pipeline(jobIDs.map { ["SMEMBERS", Self.key(forJob: $0)] })
        var result: [String: Set<String>] = [:]
        for (id, reply) in zip(jobIDs, replies) { result[id] = Set(reply.elements.compactMap(\.text)) }
        return result
    }
}
