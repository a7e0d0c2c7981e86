import APNsModel
import Foundation
import Redis
import WorkerPipeline

/// The idempotency record: per job, the tokens whose notification already had a final outcome, in a Redis set
/// `apns:job:<job id>:done` that lives an hour. Written at least every 10 ms of answers while a job is under way (and
/// for a large job as each piece completes); read only for redelivered jobs, so that a worker crash costs few or no
/// duplicate pushes.
///
/// A member is the token; for a dead token, also what its dead-token event needs
/// (`<token>|<status>|<timestamp>|<environment>|<reason>|<user>`), so that a redelivery that skips the token still
/// publishes its event: an event is never lost because the notification was not sent again.
public struct SentRecord: IdempotencyRecord {
    public static let lifetime = 3600
    /// Redeliveries of a message the broker does not count (classic queues), `apns:deliveries:<key>`: a day after
    /// the last one, a message that stopped coming back is forgotten.
    public static let deliveriesLifetime = 86_400
    // Also `apns:running:<key>`, set while a worker runs a redelivered job and deleted when it settles or is handed
    // back (found on a later delivery, the worker that ran it died with it: only then does the job become a suspect);
    // `apns:alone:<key>`, set while a worker runs a suspect job alone and deleted when the job settles (found on
    // the job's next delivery, it says the worker died with the job alone); `apns:givenback:<key>`, deliveries of a
    // message a worker gave back in an orderly stop, kept as long as the delivery counts (they do not count towards
    // making the job a suspect); and `apns:settled:<unix seconds / 10>`, the jobs settled in one ten-second span, a
    // set kept a minute, so that memory follows the rate over that minute, not an hour, looked up over the last 40 s
    // (clocks of workers may differ by a few seconds).
    static let settledSpan = 10
    static let settledLifetime = 60
    static let settledLookback = 4

    private let redis: any RedisClient
    private let redisKeys: RedisKeys

    public init(redis: any RedisClient) {
        self.redis = redis
        redisKeys = RedisKeys(cluster: redis.isCluster)
    }

    /// The member for an outcome: the token, or the token and what the job's summary (a failure's reason, an
    /// expiry) or a dead token's event needs. Redis keeps each member once: an outcome written twice counts once.
    static func member(_ outcome: SettledOutcome) -> String {
        switch outcome {
        case .done(let token):
            return token
        case .failed(let token, let reason):
            return "\(token)|failed|\(reason.prefix(Self.reasonLength))"
        case .expired(let token):
            return "\(token)|expired"
        case .dead(let target, let response):
            return "\(target.token)|\(response.status)|\(response.timestamp.map(String.init) ?? "")|"
                + "\(target.environment.rawValue)|\(response.reason?.label ?? "")|\(target.user ?? "")"
        case .summarySent:
            return summaryMember
        }
    }

    /// Not hex, so never a token.
    static let summaryMember = "summary"
    /// A failure's reason is kept to this many characters (reasons are Apple's names or the worker's short texts; a
    /// longer one is an error's text, cut here only).
    static let reasonLength = 400

    static func settled(_ members: [String]) -> Settled {
        var result = Settled()
        for member in members {
            if let outcome = outcome(member) { result.add(outcome) }
        }
        return result
    }

    /// What one member says; nil for a member this version cannot read (written by another program).
    static func outcome(_ member: String) -> SettledOutcome? {
        if member == summaryMember { return .summarySent }
        guard member.contains("|") else { return .done(member) }
        let head = member.split(separator: "|", maxSplits: 2, omittingEmptySubsequences: false)
        switch head[1] {
        case "failed" where head.count == 3: return .failed(String(head[0]), reason: String(head[2]))
        case "expired" where head.count == 2: return .expired(String(head[0]))
        default: break
        }
        let fields = member.split(separator: "|", maxSplits: 5, omittingEmptySubsequences: false).map(String.init)
        guard fields.count == 6, let status = Int(fields[1]), let environment = APNsEnvironment(rawValue: fields[3])
        else {
            return nil
        }
        return .dead(
            DeviceTarget(token: fields[0], environment: environment, user: fields[5].isEmpty ? nil : fields[5]),
            APNsResponse(
                status: status, reason: fields[4].isEmpty ? nil : APNsReason(fields[4]),
                timestamp: Int64(fields[2])))
    }

    /// Adds the batches in one round trip. Says which jobs' records Redis refused (a key of the wrong type), with its
    /// error: a data error about those jobs (a redelivery would send their notifications again), never a reason to
    /// stop the others; and which were not written because their node did not answer. Only a lost connection throws.
    public func record(_ batches: [(jobID: String, outcomes: [SettledOutcome])]) throws -> RecordWrite {
        var commands: [[String]] = []
        var jobs: [String] = []
        for batch in batches where !batch.outcomes.isEmpty {
            commands.append(["SADD", redisKeys.job(batch.jobID)] + batch.outcomes.map(Self.member))
            commands.append(["EXPIRE", redisKeys.job(batch.jobID), String(Self.lifetime)])
            jobs += [batch.jobID, batch.jobID]
        }
        guard !commands.isEmpty else { return RecordWrite() }
        var written = RecordWrite()
        for (job, reply) in zip(jobs, try redis.pipelineWhereReachable(commands)) {
            guard let reply else {
                written.unavailable.insert(job)
                continue
            }
            if case .error(let message) = reply { written.refused[job] = message }
        }
        return written
    }

    /// For each job, what was already settled, in one round trip; the jobs whose record Redis cannot read (they
    /// count as having nothing settled); and those whose record's node does not answer. Only a lost connection throws.
    public func settled(jobIDs: [String]) throws -> SettledLookup {
        var lookup = SettledLookup()
        guard !jobIDs.isEmpty else { return lookup }
        let replies = try redis.pipelineWhereReachable(jobIDs.map { ["SMEMBERS", redisKeys.job($0)] })
        for (id, reply) in zip(jobIDs, replies) {
            guard let reply else {
                lookup.unavailable.insert(id)
                continue
            }
            if case .error(let message) = reply {
                lookup.unreadable[id] = message
                continue
            }
            lookup.settled[id] = Self.settled(reply.elements.compactMap(\.text))
        }
        return lookup
    }

    /// INCR and EXPIRE per key, in one round trip. A key whose node does not answer is left out: that delivery is
    /// not counted.
    public func countRedeliveries(of keys: [String]) throws -> (counts: [String: Int], unreadable: [String: String]) {
        guard !keys.isEmpty else { return ([:], [:]) }
        let replies = try redis.pipelineWhereReachable(
            keys.flatMap { key in
                [
                    ["INCR", redisKeys.deliveries(key)],
                    ["EXPIRE", redisKeys.deliveries(key), String(Self.deliveriesLifetime)]
                ]
            })
        var counts: [String: Int] = [:]
        var unreadable: [String: String] = [:]
        for (index, key) in keys.enumerated() {
            switch replies[index * 2] {
            case nil: continue
            case .integer(let count)?: counts[key] = Int(count)
            case .error(let message)?: unreadable[key] = message
            case let other?: unreadable[key] = "INCR answered \(other)"
            }
        }
        return (counts, unreadable)
    }

    // The marks below are written where their node answers and skipped where it does not: a mark missing costs a
    // suspect its lone run, or a job given back one delivery counted, never a job.

    public func markRunning(_ keys: [String]) throws {
        guard !keys.isEmpty else { return }
        _ = try redis.pipelineWhereReachable(
            keys.map {
                ["SET", redisKeys.running($0), "1", "EX", String(Self.deliveriesLifetime)]
            })
    }

    public func clearRunning(_ keys: [String]) throws {
        guard !keys.isEmpty else { return }
        _ = try redis.pipelineWhereReachable(keys.map { ["DEL", redisKeys.running($0)] })
    }

    /// A mark whose node does not answer is not found: a job is taken for a suspect only on what is known.
    public func ranAndDied(_ keys: [String]) throws -> Set<String> {
        guard !keys.isEmpty else { return [] }
        let replies = try redis.pipelineWhereReachable(keys.map { ["EXISTS", redisKeys.running($0)] })
        return Set(zip(keys, replies).compactMap { key, reply in reply?.integer == 1 ? key : nil })
    }

    public func startingAlone(_ key: String) throws {
        _ = try redis.commandWhereReachable(["SET", redisKeys.alone(key), "1", "EX", String(Self.deliveriesLifetime)])
    }

    public func settledAlone(_ key: String) throws {
        _ = try redis.commandWhereReachable(["DEL", redisKeys.alone(key)])
    }

    public func forget(_ key: String) throws {
        _ = try redis.commandWhereReachable([
            "DEL", redisKeys.alone(key), redisKeys.deliveries(key), redisKeys.givenBack(key),
            redisKeys.running(key)
        ])
    }

    public func gaveBack(_ keys: [String]) throws {
        guard !keys.isEmpty else { return }
        _ = try redis.pipelineWhereReachable(
            keys.flatMap { key in
                [
                    ["INCR", redisKeys.givenBack(key)],
                    ["EXPIRE", redisKeys.givenBack(key), String(Self.deliveriesLifetime)],
                    ["DEL", redisKeys.running(key)]
                ]
            })
    }

    public func settledRecently(_ jobIDs: [String]) throws {
        guard !jobIDs.isEmpty else { return }
        let key = redisKeys.settled(inSpan: Int(Date().timeIntervalSince1970) / Self.settledSpan)
        _ = try redis.pipelineWhereReachable([["SADD", key] + jobIDs, ["EXPIRE", key, String(Self.settledLifetime)]])
    }

    /// A span Redis cannot read (a key of the wrong type) holds none: the copies are then sent as jobs, with the
    /// idempotency record's per-token outcomes.
    /// `SET NX` with a lifetime longer than a part can wait (a day, and the week a send_at may add).
    public func claimWindowParts(_ keys: [String]) throws -> Set<String> {
        try claim(keys, as: redisKeys.windowPart)
    }

    public func claimScheduledStarts(_ keys: [String]) throws -> Set<String> {
        try claim(keys, as: redisKeys.scheduledStart)
    }

    /// Sets each key's Redis key unless it exists, for eight days (longer than a job may wait): the keys set now, and
    /// those whose node does not answer.
    private func claim(_ keys: [String], as redisKey: (String) -> String) throws -> Set<String> {
        guard !keys.isEmpty else { return [] }
        let lifetime = String(8 * 24 * 3600)
        let replies = try redis.pipelineWhereReachable(
            keys.map { ["SET", redisKey($0), "1", "NX", "EX", lifetime] })
        return Set(
            zip(keys, replies).compactMap { key, reply in
                guard let reply else { return key }
                if case .error = reply { return key }
                return reply.text == "OK" ? key : nil
            })
    }

    public func recentlySettled(_ jobIDs: [String]) throws -> Set<String> {
        guard !jobIDs.isEmpty else { return [] }
        let now = Int(Date().timeIntervalSince1970) / Self.settledSpan
        let spans = (0..<Self.settledLookback).map { now - $0 }
        let replies = try redis.pipelineWhereReachable(
            spans.map { ["SMISMEMBER", redisKeys.settled(inSpan: $0)] + jobIDs })
        var found = Set<String>()
        for reply in replies {
            for (id, member) in zip(jobIDs, reply?.elements ?? []) where member.integer == 1 { found.insert(id) }
        }
        return found
    }

    /// A count Redis cannot read (a key of the wrong type) is none: the job is judged by its deliveries alone.
    public func givenBack(_ keys: [String]) throws -> [String: Int] {
        guard !keys.isEmpty else { return [:] }
        let replies = try redis.pipelineWhereReachable(keys.map { ["GET", redisKeys.givenBack($0)] })
        var counts: [String: Int] = [:]
        for (key, value) in zip(keys, replies) {
            if let count = value?.text.flatMap({ Int($0) }), count > 0 { counts[key] = count }
        }
        return counts
    }

    public func diedAlone(_ keys: [String]) throws -> Set<String> {
        guard !keys.isEmpty else { return [] }
        // A mark whose node does not answer is not found: a job is parked as poison only on what is known.
        let replies = try redis.pipelineWhereReachable(keys.map { ["EXISTS", redisKeys.alone($0)] })
        return Set(zip(keys, replies).compactMap { key, reply in reply?.integer == 1 ? key : nil })
    }
}
