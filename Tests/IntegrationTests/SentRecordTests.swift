import APNsModel
import Redis
import RedisStore
import Testing
import WorkerPipeline

/// The idempotency record (`apns:job:<id>:done`) against a real Redis: what a worker writes, another reads back.
@Suite struct SentRecordTests {
    /// Every kind of outcome reads back as written, for the job's summary and its dead tokens' events; a member this
    /// version cannot read is skipped; the record lives an hour.
    @Test func outcomesReadBackAsWritten() throws {
        let redis = try RedisConnection(url: TestServices.redisURL())
        let record = SentRecord(redis: redis)
        let job = TestServices.unique("record")
        let delivered = String(repeating: "0a", count: 32)
        let expired = String(repeating: "0d", count: 32)
        let dead = DeviceTarget(token: String(repeating: "0b", count: 32), environment: .production, user: "ann")
        let written = try record.record([
            (
                job,
                [
                    .done(delivered), .expired(expired),
                    .dead(dead, APNsResponse(status: 410, reason: .unregistered, timestamp: 1_700_000_000_000)),
                    .failed(String(repeating: "0c", count: 32), reason: "PayloadTooLarge"), .summarySent
                ]
            )
        ])
        #expect(written.refused.isEmpty && written.unavailable.isEmpty)
        _ = try redis.command(["SADD", RedisKeys.node.job(job), "users|0|250|250"])
        let settled = try #require(try record.settled(jobIDs: [job]).settled[job])
        #expect(settled.tokens.count == 4, "the member it cannot read skipped: \(settled.tokens)")
        #expect(settled.earlier.delivered == 1 && settled.earlier.expired == 1 && settled.earlier.dead == 1)
        #expect(settled.earlier.failedByReason == ["PayloadTooLarge": 1])
        #expect(settled.dead.map(\.target) == [dead] && settled.dead.first?.response.timestamp == 1_700_000_000_000)
        #expect(settled.summarySent)
        let lifetime = try redis.command(["TTL", RedisKeys.node.job(job)]).integer ?? -1
        #expect((3500...3600).contains(lifetime), "an hour: \(lifetime)")
    }
}
