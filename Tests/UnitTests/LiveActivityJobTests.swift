import APNs
import Foundation
import JSON
import Testing
import WorkerPipeline

/// `live_activity` jobs: the aps dictionary ActivityKit expects, built by the worker, and what it refuses.
@Suite struct LiveActivityJobTests {
    let now = Int64(Date().timeIntervalSince1970)

    func decode(_ liveActivity: String, extra: String = "") throws(JobError) -> PushJob {
        try PushJob.decode(
            Array(
                #"{"topic": "com.example.app", "tokens": ["\#(String(repeating: "ab", count: 32))"]\#(extra), "live_activity": \#(liveActivity)}"#
                    .utf8),
            defaultTopic: nil, fallbackID: "fallback")
    }

    func aps(_ job: PushJob) throws -> [String: Any] {
        let payload = try #require(try JSONSerialization.jsonObject(with: Data(job.payload)) as? [String: Any])
        return try #require(payload["aps"] as? [String: Any])
    }

    @Test func aStartBecomesActivityKitsDictionary() throws {
        let job = try decode(
            #"""
            {"event": "start", "timestamp": \#(now), "content_state": {"score": "0-0", "minute": 1},
             "attributes_type": "MatchAttributes", "attributes": {"home": "Lyon", "away": "Nantes"},
             "alert": {"title": "Kick-off", "body": "Lyon - Nantes"}, "stale_date": \#(now + 3600), "relevance_score": 75.5,
             "input_push_channel": "dHJhY2tpbmc=", "input_push_token": true}
            """#)
        #expect(job.pushType == .liveactivity && job.topic == "com.example.app.push-type.liveactivity")
        #expect(job.priority == .immediately)
        let aps = try aps(job)
        #expect(aps["event"] as? String == "start" && (aps["timestamp"] as? NSNumber)?.int64Value == now)
        #expect((aps["content-state"] as? [String: Any])?["score"] as? String == "0-0")
        #expect(aps["attributes-type"] as? String == "MatchAttributes")
        #expect((aps["attributes"] as? [String: Any])?["home"] as? String == "Lyon")
        #expect((aps["alert"] as? [String: Any])?["title"] as? String == "Kick-off")
        #expect((aps["stale-date"] as? NSNumber)?.int64Value == now + 3600)
        #expect((aps["relevance-score"] as? NSNumber)?.doubleValue == 75.5)
        #expect(aps["input-push-channel"] as? String == "dHJhY2tpbmc=" && (aps["input-push-token"] as? NSNumber) == 1)
        #expect(
            String(decoding: job.payload, as: UTF8.self).contains(#"{"score": "0-0", "minute": 1}"#),
            "objects are copied byte for byte")
    }

    @Test func anUpdateAndAnEnd() throws {
        let update = try aps(
            try decode(
                #"{"event": "update", "timestamp": \#(now - 5), "content_state": {"score": "1-0"}}"#,
                extra: #", "priority": 5"#))
        #expect(update["event"] as? String == "update" && update["attributes"] == nil && update["alert"] == nil)
        let end = try aps(
            try decode(
                #"{"event": "end", "timestamp": \#(now), "content_state": {"score": "2-1"}, "dismissal_date": \#(now + 60)}"#
            ))
        #expect(end["event"] as? String == "end" && (end["dismissal-date"] as? NSNumber)?.int64Value == now + 60)
    }

    @Test(arguments: JobCorpus.refusedLiveActivities)
    func aBrokenLiveActivityIsRefusedWithItsReason(liveActivity: String, expected: String) {
        do {
            _ = try decode(liveActivity)
            Issue.record("accepted: \(liveActivity)")
        } catch {
            #expect(error.description.contains(expected), "\(error)")
        }
    }

    @Test func aLiveActivityIsNotMixedWithAPayloadOrAnotherPushType() {
        let update = #"{"event": "update", "timestamp": 1, "content_state": {}}"#
        for (extra, expected) in [
            (#", "payload": {"aps": {}}"#, "not both"),
            (#", "push_type": "alert""#, "a Live Activity is sent as liveactivity")
        ] {
            do {
                _ = try decode(update, extra: extra)
                Issue.record("accepted with \(extra)")
            } catch {
                #expect(error.description.contains(expected), "\(error)")
            }
        }
    }

    /// `channel_id` jobs: a broadcast, with no targets, a Live Activity update or end, its payload up to 5 KB.
    @Test func aBroadcastJob() throws {
        func broadcast(_ rest: String) throws(JobError) -> PushJob {
            try PushJob.decode(
                Array(#"{"topic": "com.example.app", "channel_id": "dHJhY2tpbmc=", \#(rest)}"#.utf8),
                defaultTopic: nil, fallbackID: "fallback")
        }
        let job = try broadcast(#""live_activity": {"event": "update", "timestamp": 1, "content_state": {}}"#)
        #expect(
            job.kind == .broadcast(channelID: "dHJhY2tpbmc=") && job.users.isEmpty && job.tokens.isEmpty
                && job.pushType == .liveactivity)
        let request = job.broadcast(on: "dHJhY2tpbmc=")
        #expect(request.bundle == "com.example.app" && request.expiration == 0)
        // A broadcast keeps its schedule and its id's origin as every job does.
        let sendAt = Int64(Date().timeIntervalSince1970) + 3_600
        let update = #""live_activity": {"event": "update", "timestamp": 1, "content_state": {}}"#
        let scheduled = try broadcast(#""id": "b1", "deadline": \#(sendAt + 60), "send_at": \#(sendAt), "# + update)
        #expect(scheduled.deadline == sendAt + 60 && scheduled.sendAt == sendAt && scheduled.idFromBody)
        #expect(!job.idFromBody && job.deadline == nil && job.sendAt == nil)
        let large = String(repeating: "x", count: 4500)
        #expect(
            try broadcast(
                #""payload": {"aps": {"timestamp": 1, "event": "update", "content-state": {"n": "\#(large)"}}}"#
            )
            .payload.count > 4096, "a broadcast's payload may pass 4096 bytes")
        for (rest, expected) in [
            (
                #""users": ["u1"], "live_activity": {"event": "update", "timestamp": 1, "content_state": {}}"#,
                "give no \"users\""
            ),
            (
                #""live_activity": {"event": "start", "timestamp": 1, "content_state": {}, "attributes_type": "A", "attributes": {}, "alert": {}}"#,
                "cannot start a Live Activity"
            ),
            (#""push_type": "alert", "payload": {"aps": {}}"#, "a broadcast is a Live Activity push")
        ] {
            do {
                _ = try broadcast(rest)
                Issue.record("accepted: \(rest)")
            } catch {
                #expect(error.description.contains(expected), "\(error)")
            }
        }
        do {
            _ = try PushJob.decode(
                Array(#"{"topic": "com.example.app", "channel_id": "not base64!", "payload": {}}"#.utf8),
                defaultTopic: nil, fallbackID: "x")
            Issue.record("a channel id that is not base64 was accepted")
        } catch {
            #expect(error.description.contains("not base64"), "\(error)")
        }
    }
}
