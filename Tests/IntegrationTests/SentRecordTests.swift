import APNsModel
import Redis
import RedisStore
import Testing
import WorkerPipeline

/// The idempotency record (`apns:job:<id>:done`) against a real Redis: what a worker writes, another reads back.
@Suite struct SentRecordTests {
    /// Every kind of outcome reads back as written; a run of a large job's users is one member whose delivered count
    /// joins the summary's; a member this version cannot read (a malformed run) is skipped; a settled large job's
    /// record is deleted.
    @Test func outcomesReadBackAsWrittenAndARecordIsForgotten() throws {
        let redis = try RedisConnection(url: TestServices.redisURL())
        let record = SentRecord(redis: redis)
        let job = TestServices.unique("record")
        let delivered = String(repeating: "0a", count: 32)
        let dead = DeviceTarget(token: String(repeating: "0b", count: 32), environment: .production, user: "ann")
        let written = try record.record([
            (
                job,
                [
                    .done(delivered), .users(250..<500, delivered: 310),
                    .dead(dead, APNsResponse(status: 410, reason: .unregistered, timestamp: 1_700_000_000_000)),
                    .failed(String(repeating: "0c", count: 32), reason: "PayloadTooLarge"), .summarySent
                ]
            )
        ])
        #expect(written.refused.isEmpty && written.unavailable.isEmpty)
        _ = try redis.command(["SADD", RedisKeys.node.job(job), "users|x|250|3", "users|0|0|1"])
        let settled = try #require(try record.settled(jobIDs: [job]).settled[job])
        #expect(settled.doneUsers == [250..<500], "one run, the malformed ones skipped")
        #expect(settled.earlier.delivered == 311, "the run's 310 and the token's one")
        #expect(settled.tokens.count == 3 && settled.dead.map(\.target) == [dead] && settled.summarySent)
        #expect(settled.earlier.failedByReason == ["PayloadTooLarge": 1])
        try record.forgetRecords(of: [job])
        #expect(try redis.command(["EXISTS", RedisKeys.node.job(job)]).integer == 0)
    }
}
