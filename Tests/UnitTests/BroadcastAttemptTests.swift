import Testing

@testable import WorkerPipeline

/// A broadcast retry copy counts its attempt in a message header, which anyone publishing could set: what the worker
/// reads of it stays within the attempts it could have counted.
@Suite struct BroadcastAttemptTests {
    func attempt(header: String?) throws -> Int {
        let body = Array(#"{"topic": "com.example.app", "channel_id": "dHJhY2tpbmc=", "payload": {"aps": {}}}"#.utf8)
        let job = try PushJob.decode(body, defaultTopic: nil, fallbackID: "f")
        var properties = MessageProperties()
        if let header { properties.headers[SessionLoop.broadcastAttemptHeader] = header }
        let delivery = JobDelivery(tag: 1, redelivered: false, body: body, properties: properties)
        return BroadcastJob(delivery: delivery, job: job, channelID: "dHJhY2tpbmc=").attempt
    }

    @Test func theAttemptIsTheHeadersWithinTheAttemptsTheWorkerCounts() throws {
        #expect(try attempt(header: nil) == 1)
        #expect(try attempt(header: "3") == 3)
        #expect(try attempt(header: "soon") == 1)
        #expect(try attempt(header: "-9223372036854775808") == 1, "Int.min less one would trap")
        #expect(try attempt(header: "9223372036854775807") == PushJob.maximumAttempt)
    }
}
