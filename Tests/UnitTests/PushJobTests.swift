import APNs
import Foundation
import JSON
import Testing
import WorkerPipeline

@Suite struct PushJobTests {
    func decode(_ text: String, defaultTopic: String? = nil) throws(JobError) -> PushJob {
        try PushJob.decode(Array(text.utf8), defaultTopic: defaultTopic, fallbackID: "fallback")
    }

    @Test func decodesTheContractExample() throws {
        let token = String(repeating: "a1", count: 32)
        let job = try decode("""
        {"id": "job-42", "topic": "com.example.app", "users": ["u1", "u2"], "tokens": ["\(token)"],
         "environment": "sandbox", "push_type": "alert", "priority": 10, "expiration": 0,
         "collapse_id": "order-7", "payload": {"aps": {"alert": "Hello"}, "n": 1.50}}
        """)
        #expect(job.id == "job-42")
        #expect(job.topic == "com.example.app")
        #expect(job.users == ["u1", "u2"])
        #expect(job.tokens == [token])
        #expect(job.environment == .sandbox)
        #expect(job.priority == .immediately)
        #expect(job.expiration == 0)
        #expect(job.collapseID == "order-7")
        #expect(String(decoding: job.payload, as: UTF8.self) == #"{"aps": {"alert": "Hello"}, "n": 1.50}"#,
                "the payload is forwarded byte for byte")
    }

    @Test func appliesDefaults() throws {
        let job = try decode(#"{"users": ["u1"], "payload": {"aps": {}}}"#, defaultTopic: "com.example.app")
        #expect(job.id == "fallback")
        #expect(job.topic == "com.example.app")
        #expect(job.environment == .production)
        #expect(job.pushType == .alert)
        #expect(job.priority == .immediately)
        let background = try decode(#"{"users": ["u1"], "push_type": "background", "payload": {"aps": {"content-available": 1}}}"#,
                                    defaultTopic: "com.example.app")
        #expect(background.priority == .considerPower)
        let voip = try decode(#"{"users": ["u1"], "push_type": "voip", "payload": {}}"#, defaultTopic: "com.example.app")
        #expect(voip.topic == "com.example.app.voip")
    }

    @Test(arguments: JobCorpus.refused)
    func badJobsAreNamed(body: String, expected: String) {
        do {
            _ = try decode(body)
            Issue.record("decoded a bad job: \(body)")
        } catch {
            #expect(error.description.contains(expected), "\(error.description)")
        }
    }

    @Test func oversizedAndNonUTF8BodiesAreRefused() {
        var bytes = Array(#"{"users": ["u"], "topic": "t", "payload": {"x": ""#.utf8)
        bytes += Array(repeating: UInt8(ascii: "a"), count: 5000)
        bytes += Array(#""}}"#.utf8)
        #expect(throws: JobError.self) { try PushJob.decode(bytes, defaultTopic: nil, fallbackID: "f") }
        do { _ = try PushJob.decode(bytes, defaultTopic: nil, fallbackID: "f") } catch {
            #expect(error.description.contains("over the 4096-byte limit for push_type alert"))
        }
        #expect(throws: JobError.notUTF8) { try PushJob.decode([0x7B, 0xFF, 0x7D], defaultTopic: nil, fallbackID: "f") }
        // Told apart once the reader refuses the body, wherever the bytes that are not UTF-8 sit.
        for place in [#"{"users": ["u"], "topic": "t", "payload": {"x": "a\#u{1}b"}}"#,
                      #"{"users": ["u"], "topic": "t", "payload": {"a\#u{1}b": 1}}"#, #"{"users": ["\#u{1}"]}"#] {
            let bytes = Array(place.utf8).map { $0 == 1 ? 0xFF : $0 }
            #expect(throws: JobError.notUTF8, "\(place)") { try PushJob.decode(bytes, defaultTopic: "t", fallbackID: "f") }
        }
        var limits = PushJob.Limits()
        limits.maximumMessageSize = 10
        #expect(throws: JobError.tooLarge(size: 12, limit: 10)) {
            try PushJob.decode(Array(#"{"a":"bcde"}"#.utf8), defaultTopic: nil, fallbackID: "f", limits: limits)
        }
    }

    @Test func deepNestingIsRefused() {
        let deep = String(repeating: "[", count: 100) + String(repeating: "]", count: 100)
        let body = #"{"users": ["u"], "topic": "t", "payload": {"x": \#(deep)}}"#
        do {
            _ = try decode(body)
            Issue.record("accepted 100 levels")
        } catch {
            #expect(error.description.contains("nesting deeper than"))
        }
    }
}

@Suite struct JSONReaderTests {
    @Test func parsesEscapesAndUnicode() throws {
        let value = try JSONReader.parse(Array(#"{"a":"\u00e9\ud83d\ude00\n","b":[true,false,null,-1.5e3]}"#.utf8))
        #expect(value["a"] == .string("é😀\n"))
        #expect(value["b"] == .array([.bool(true), .bool(false), .null, .number("-1.5e3")]))
    }

    @Test(arguments: ["", "{", "{\"a\":}", "[1,]", "01", "\"\\x\"", "{\"a\":1}x", "\"\u{1}\"", "tru", "\"\\ud800\""])
    func rejectsInvalidJSON(text: String) {
        #expect(throws: JSONError.self) { try JSONReader.parse(Array(text.utf8)) }
    }

    /// Payloads good and bad, each placed as the value of a member read by `checkValue`: checking without building
    /// must accept and refuse exactly what building does, with the same error at the same byte, and measure the same
    /// depth.
    static let payloads = [
        #"{"aps":{"alert":{"title":"T","body":"B"},"badge":1},"k":[1,-2.5e3,true,false,null,"x",{}]}"#,
        #"{"a":"\u00e9\ud83d\ude00\n","b":"é😀 ok","c":[[[]]],"d":{}}"#, #"[]"#, #"[{"a":1},{"a":1}]"#, #""text""#, #"12"#,
        #"{"a":1,"a":2}"#, #"{"a":1,"\u0061":2}"#, #"{"\u0061":1,"a":2}"#, #"{"é":1,"\u00e9":2}"#,
        #"{"x":{"a":1,"b":{"a":2}},"y":{"a":{"a":{}}}}"#, #"{"ab":1,"a":2,"b":3,"ba":4}"#,
        #"{"x":{"alert":"a","alert":"b"}}"#, #"[1,]"#, #"{"a":}"#, #"{"a" 1}"#, #"{"a":1 "b":2}"#, #"["\x"]"#,
        #"["\ud800"]"#, "[\"\u{1}\"]", #"[01]"#, #"[-]"#, #"[1.]"#, #"[1e]"#, #"[tru]"#, #"{"a":[1,2}"#, #"{"#, #"["#,
        #"{"a":"unterminated}"#, #"{1:2}"#, #"[[[[[[[[[[1]]]]]]]]]]"#,
        "{" + (0..<40).map { #""k\#($0)":\#($0)"# }.joined(separator: ",") + #","k7":0}"#,
        "{" + (0..<40).map { #""k\#($0)":\#($0)"# }.joined(separator: ",") + #","\u006b7":0}"#,
        "{" + (0..<40).map { #""k\#($0)":\#($0)"# }.joined(separator: ",") + "}",
        // Names past the reader's first 512 bytes of them, nested past its first 32 names.
        "{" + (0..<20).map { #""\#(String(repeating: "n", count: 40))\#($0)":{"a\#($0)":1}"# }.joined(separator: ",") + "}",
        "{" + (0..<20).map { #""\#(String(repeating: "n", count: 40))\#($0)":{"a":1}"# }.joined(separator: ",")
            + #","\#(String(repeating: "n", count: 40))7":2}"#,
    ]

    @Test(arguments: payloads)
    func checkedMembersAreCheckedAsStrictlyAsBuiltOnes(payload: String) {
        var document = Array(#"{"id":"j","payload":"#.utf8)
        document += Array(payload.utf8) + [UInt8(ascii: "}")]
        let invalidUTF8 = Array(#"{"payload":{"a":""#.utf8) + [0xC3, 0x28] + Array(#""}}"#.utf8)
        for bytes in [document, invalidUTF8] {
            let built = Result { () throws(JSONError) in try JSONReader.parseMeasuringDepth(bytes, maximumDepth: 8) }
            var checkedPayload: JSONMember?
            let checked = Result { () throws(JSONError) in
                try JSONReader.readObject(bytes, maximumDepth: 8, known: JSONNames(["payload"])) { reader, index throws(JSONError) in
                    guard index == 0 else { return }
                    let start = reader.offset
                    let value = try reader.checkValue()
                    checkedPayload = JSONMember(key: "payload", value: value, range: start..<reader.offset)
                }
            }
            switch (built, checked) {
            case (.success(let full), .success(let topLevel)):
                #expect(topLevel == .object(depth: full.depth))
                let range = checkedPayload?.range
                #expect(range == full.value.member("payload")?.range)
                if bytes == document { #expect(range.map { Array(bytes[$0]) } == Array(payload.utf8)) }
                // Scalars come back as read; objects and arrays empty, of the same kind.
                switch (full.value["payload"], checkedPayload?.value) {
                case (.object?, .object([])?), (.array?, .array([])?): break
                case (let a, let b): #expect(a == b)
                }
            case (.failure(let full), .failure(let checked)):
                #expect(full == checked)
            default:
                Issue.record("built: \(built), checked: \(checked)")
            }
        }
    }

    /// Strings are scanned eight bytes at a time: an end, an escape, a control character or a non-ASCII byte at
    /// every offset of a word is still found.
    @Test func stringsAreReadWhereverTheirEndEscapeOrBadByteFalls() throws {
        for offset in 0..<20 {
            let before = String(repeating: "a", count: offset)
            func parse(_ middle: [UInt8]) -> Result<JSONValue, JSONError> {
                let bytes = Array(#"{"k":""#.utf8) + Array(before.utf8) + middle + Array(#"bcdefghij","n":1}"#.utf8)
                return Result { () throws(JSONError) in try JSONReader.parse(bytes) }
            }
            #expect(try parse(Array(#"\""#.utf8)).get()["k"] == .string(before + "\"bcdefghij"))
            #expect(try parse(Array("é".utf8)).get()["k"] == .string(before + "ébcdefghij"))
            #expect(try parse(Array(#"""#.utf8) + Array(#","x":""#.utf8)).get()["x"] == .string("bcdefghij"))
            for bad: [UInt8] in [[0x01], [0x1F], [0xC3, 0x28], [0xFF]] {
                #expect(throws: JSONError.self, "byte \(bad) at \(offset)") { try parse(bad).get() }
                // The bad byte the last before the string's end.
                #expect(throws: JSONError.self, "byte \(bad) at \(offset), then the end") {
                    try parse(bad + Array(#"","x":""#.utf8)).get()
                }
            }
        }
    }

    /// Names are told apart by their bytes however many an object has: é precomposed and decomposed are two names
    /// (as for Python, JavaScript or Go, whose disagreement the duplicate check is about); the same é twice, once
    /// escaped, is one name given twice.
    @Test func namesAreToldApartByTheirBytes() throws {
        let others = (0..<20).map { #""k\#($0)":0,"# }
        for count in [0, 20] {
            let prefix = others.prefix(count).joined()
            let distinct = "{" + prefix + "\"\u{E9}\":1,\"e\u{301}\":2}"
            guard case .object(let members) = try JSONReader.parse(Array(distinct.utf8)) else {
                Issue.record("not an object")
                return
            }
            #expect(members.count == count + 2, "\(count) other names")
            let same = "{" + prefix + "\"\u{E9}\":1,\"\\u00e9\":2}"
            #expect(throws: JSONError.self, "\(count) other names") { try JSONReader.parse(Array(same.utf8)) }
        }
    }

    @Test func namesPastTheReadersFirstStorageKeepTheirBytes() throws {
        let long = String(repeating: "n", count: 40)
        let names = (0..<40).map { "\(long)\($0)" }
        let document = "{" + names.map { #""\#($0)":{"a":1}"# }.joined(separator: ",") + "}"
        guard case .object(let members) = try JSONReader.parse(Array(document.utf8)) else {
            Issue.record("not an object")
            return
        }
        #expect(members.map(\.key) == names)
        let repeated = "{" + names.map { #""\#($0)":1"# }.joined(separator: ",") + #","\#(names[7])":2}"#
        #expect(throws: JSONError.self) { try JSONReader.parse(Array(repeated.utf8)) }
        do { _ = try JSONReader.parse(Array(repeated.utf8)) } catch {
            #expect(error.description.hasPrefix("duplicate key \"\(names[7])\""))
        }
    }

    @Test func membersAreReadIntoTheirOwnFieldsAndDuplicatesRefusedAtTheTopToo() throws {
        let names = JSONNames(["users", "n"])
        var users: JSONStrings?
        var others: [JSONValue] = []
        let document = Array(#"{"x": {"users": 1}, "users": ["a", "\u00e9"], "n": [1, "b"], "users2": 3}"#.utf8)
        let topLevel = try JSONReader.readObject(document, known: names) { reader, index throws(JSONError) in
            switch index {
            case 0?: users = try reader.readStrings()
            case 1?: others.append(try reader.readValue())
            default: break
            }
        }
        #expect(topLevel == .object(depth: 2))
        #expect(users == .strings(["a", "é"]))
        #expect(others == [.array([.number("1"), .string("b")])])
        var strings: [JSONStrings] = []
        _ = try JSONReader.readObject(Array(#"{"n": [1, "b"], "users": "u"}"#.utf8), known: names) { reader, _ throws(JSONError) in
            strings.append(try reader.readStrings())
        }
        #expect(strings == [.notAString(index: 0, typeName: "a number"), .other(.string("u"))])
        #expect(try JSONReader.readObject(Array("[1]".utf8), known: names) { _, _ throws(JSONError) in } == .other(typeName: "an array"))
        let repeated = Array(#"{"users": [], "us\u0065rs": []}"#.utf8)
        do {
            _ = try JSONReader.readObject(repeated, known: names) { reader, _ throws(JSONError) in _ = try reader.readStrings() }
            Issue.record("accepted a name given twice")
        } catch {
            #expect(error.description == #"duplicate key "users" at byte 14"#)
        }
    }
}

@Suite struct DeadTokenEventTests {
    @Test func encodesTheContractShape() throws {
        let event = DeadTokenEvent(token: "abcd", user: "u1", topic: "com.example.app", environment: .production,
                                   status: 410, reason: "Unregistered", timestamp: 1_732_900_000_000, jobID: "job-42")
        let object = try JSONSerialization.jsonObject(with: Data(event.json)) as! [String: Any]
        #expect(object["token"] as? String == "abcd")
        #expect(object["user"] as? String == "u1")
        #expect(object["topic"] as? String == "com.example.app")
        #expect(object["environment"] as? String == "production")
        #expect((object["status"] as? NSNumber)?.intValue == 410)
        #expect(object["reason"] as? String == "Unregistered")
        #expect((object["timestamp"] as? NSNumber)?.int64Value == 1_732_900_000_000)
        #expect(object["job_id"] as? String == "job-42")

        let direct = DeadTokenEvent(token: "ab", user: nil, topic: "t", environment: .sandbox, status: 400,
                                    reason: "BadDeviceToken", timestamp: nil, jobID: "j\"1")
        let decoded = try JSONSerialization.jsonObject(with: Data(direct.json)) as! [String: Any]
        #expect(decoded["user"] is NSNull)
        #expect(decoded["timestamp"] is NSNull)
        #expect(decoded["job_id"] as? String == "j\"1")
    }
}

@Suite struct PrevalidationTests {
    @Test func prevalidationSendsASilentBackgroundPush() throws {
        let job = try PushJob.decode(Array(#"{"id": "campaign-1", "users": ["u1"], "prevalidate": true, "push_type": "alert", "payload": {"aps": {"alert": "Big sale"}}}"#.utf8),
                                     defaultTopic: "com.example.app", fallbackID: "f")
        #expect(job.pushType == .background)
        #expect(job.priority == .considerPower)
        #expect(job.expiration == 0)
        #expect(job.topic == "com.example.app")
        #expect(String(decoding: job.payload, as: UTF8.self) == #"{"aps":{"content-available":1}}"#,
                "the campaign's real payload is not sent")
    }

    @Test func retryBodiesRoundTripAndKeepTheOriginalJob() throws {
        let original = Array(#"{"id": "r", "users": ["u\"1"], "tokens": ["aa"], "collapse_id": "c", "expiration": 5, "deadline": 1798761600, "payload": {"aps": {"alert": "x"}}}"#.utf8)
        let targets = [DeviceTarget(token: "bb", environment: .sandbox, user: "u\"1"), DeviceTarget(token: "cc", environment: .production, user: nil)]
        let first = try PushJob.decode(original, defaultTopic: "t", fallbackID: "f")
        #expect(first.attempt == 1)
        let job = try PushJob.decode(first.retryBody(targets: targets, original: original), defaultTopic: nil, fallbackID: "f")
        #expect(job.attempt == 2)
        let again = try PushJob.decode(job.retryBody(targets: targets, original: original), defaultTopic: nil, fallbackID: "f")
        #expect(again.attempt == 3)
        #expect(again.retryTargets == targets)
        #expect(again.payload == job.payload)
        #expect(again.collapseID == "c" && again.expiration == 5 && again.topic == "t" && again.id == "r")
        #expect(again.deadline == 1_798_761_600, "a retry keeps the job's deadline")
        #expect(again.originalBody == original, "what is parked after the last attempt is what the sender enqueued")
        // A retry of a retry carries the same original, not the first retry's body.
        let third = try PushJob.decode(again.retryBody(targets: [targets[0]], original: Array("{}".utf8)), defaultTopic: nil,
                                       fallbackID: "f")
        #expect(third.originalBody == original && third.attempt == 4)
    }

    /// A retry body is the worker's own: it may be larger and two levels deeper than a job, as it holds the job.
    @Test func retryBodiesMayExceedTheJobLimitsByTheJobTheyHold() throws {
        var limits = PushJob.Limits()
        limits.maximumMessageSize = 200
        limits.maximumDepth = 4
        let original = Array(#"{"id": "r", "tokens": ["aa"], "topic": "t", "payload": {"aps": {"alert": {"title": "x"}}}}"#.utf8)
        let job = try PushJob.decode(original, defaultTopic: nil, fallbackID: "f", limits: limits)
        let retry = job.retryBody(targets: [DeviceTarget(token: "aa", environment: .production, user: nil)], original: original)
        #expect(retry.count > 200)
        #expect(try PushJob.decode(retry, defaultTopic: nil, fallbackID: "f", limits: limits).originalBody == original)
        let deep = Array(#"{"tokens": ["aa"], "topic": "t", "payload": {"aps": {"alert": {"title": {"x": 1}}}}}"#.utf8)
        #expect(throws: JobError.self, "a job is held to the depth limit") {
            try PushJob.decode(deep, defaultTopic: nil, fallbackID: "f", limits: limits)
        }
    }
}

/// `live_activity` jobs: the aps dictionary ActivityKit expects, built by the worker, and what it refuses.
@Suite struct LiveActivityJobTests {
    let now = Int64(Date().timeIntervalSince1970)

    func decode(_ liveActivity: String, extra: String = "") throws(JobError) -> PushJob {
        try PushJob.decode(Array(#"{"topic": "com.example.app", "tokens": ["\#(String(repeating: "ab", count: 32))"]\#(extra), "live_activity": \#(liveActivity)}"#.utf8),
                           defaultTopic: nil, fallbackID: "fallback")
    }

    func aps(_ job: PushJob) throws -> [String: Any] {
        let payload = try #require(try JSONSerialization.jsonObject(with: Data(job.payload)) as? [String: Any])
        return try #require(payload["aps"] as? [String: Any])
    }

    @Test func aStartBecomesActivityKitsDictionary() throws {
        let job = try decode(#"""
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
        #expect(String(decoding: job.payload, as: UTF8.self).contains(#"{"score": "0-0", "minute": 1}"#),
                "objects are copied byte for byte")
    }

    @Test func anUpdateAndAnEnd() throws {
        let update = try aps(try decode(#"{"event": "update", "timestamp": \#(now - 5), "content_state": {"score": "1-0"}}"#,
                                        extra: #", "priority": 5"#))
        #expect(update["event"] as? String == "update" && update["attributes"] == nil && update["alert"] == nil)
        let end = try aps(try decode(#"{"event": "end", "timestamp": \#(now), "content_state": {"score": "2-1"}, "dismissal_date": \#(now + 60)}"#))
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
        for (extra, expected) in [(#", "payload": {"aps": {}}"#, "not both"),
                                  (#", "push_type": "alert""#, "a Live Activity is sent as liveactivity")] {
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
            try PushJob.decode(Array(#"{"topic": "com.example.app", "channel_id": "dHJhY2tpbmc=", \#(rest)}"#.utf8),
                               defaultTopic: nil, fallbackID: "fallback")
        }
        let job = try broadcast(#""live_activity": {"event": "update", "timestamp": 1, "content_state": {}}"#)
        #expect(job.kind == .broadcast(channelID: "dHJhY2tpbmc=") && job.users.isEmpty && job.tokens.isEmpty
                && job.pushType == .liveactivity)
        let request = job.broadcast(on: "dHJhY2tpbmc=")
        #expect(request.bundle == "com.example.app" && request.expiration == 0)
        let large = String(repeating: "x", count: 4500)
        #expect(try broadcast(#""payload": {"aps": {"timestamp": 1, "event": "update", "content-state": {"n": "\#(large)"}}}"#)
            .payload.count > 4096, "a broadcast's payload may pass 4096 bytes")
        for (rest, expected) in [
            (#""users": ["u1"], "live_activity": {"event": "update", "timestamp": 1, "content_state": {}}"#, "give no \"users\""),
            (#""live_activity": {"event": "start", "timestamp": 1, "content_state": {}, "attributes_type": "A", "attributes": {}, "alert": {}}"#,
             "cannot start a Live Activity"),
            (#""push_type": "alert", "payload": {"aps": {}}"#, "a broadcast is a Live Activity push"),
        ] {
            do {
                _ = try broadcast(rest)
                Issue.record("accepted: \(rest)")
            } catch {
                #expect(error.description.contains(expected), "\(error)")
            }
        }
        do {
            _ = try PushJob.decode(Array(#"{"topic": "com.example.app", "channel_id": "not base64!", "payload": {}}"#.utf8),
                                   defaultTopic: nil, fallbackID: "x")
            Issue.record("a channel id that is not base64 was accepted")
        } catch {
            #expect(error.description.contains("not base64"), "\(error)")
        }
    }
}
