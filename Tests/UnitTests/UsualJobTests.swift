import APNsModel
import Foundation
import Testing

@testable import WorkerPipeline

/// The one-pass reading of usual jobs (`PushJob.decodeUsual`) against the member-by-member one: for every body it
/// either declines or returns exactly the job the other returns, so that `decode` means the same whichever reads.
@Suite struct UsualJobTests {
    static let topic = "com.example.app"
    static let token = String(repeating: "0a", count: 32)

    /// Reads `body` both ways and checks that they agree; returns the one-pass reading's job.
    @discardableResult
    func agree(
        _ body: [UInt8], defaultTopic: String? = topic, limits: PushJob.Limits = .init(),
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> PushJob? {
        let usual = PushJob.decodeUsual(body, defaultTopic: defaultTopic, fallbackID: { "fallback" }, limits: limits)
        guard let usual else { return nil }
        do {
            let general = try PushJob.decodeMemberByMember(
                body, defaultTopic: defaultTopic, fallbackID: "fallback", limits: limits)
            #expect(
                general == usual, "\(String(decoding: body, as: UTF8.self))", sourceLocation: sourceLocation)
        } catch {
            Issue.record(
                "read in one pass, refused member by member (\(error)): \(String(decoding: body, as: UTF8.self))",
                sourceLocation: sourceLocation)
        }
        return usual
    }

    @discardableResult
    func agree(
        _ text: String, defaultTopic: String? = topic, limits: PushJob.Limits = .init(),
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> PushJob? {
        agree(Array(text.utf8), defaultTopic: defaultTopic, limits: limits, sourceLocation: sourceLocation)
    }

    static let usual: [String] = [
        #"{"id": "bench-7", "tokens": ["\#(token)"], "payload": {"aps": {"alert": {"title": "T", "body": "B"}, "badge": 1}, "sent_at_us": 1796184000000000}}"#,
        #"{"users": ["u1", "u2", "u3"], "payload": {"aps": {"alert": "Hello"}}}"#,
        #"{"id": "job-42", "topic": "com.example.app", "users": ["u1", "u2"], "tokens": ["\#(token)"], "environment": "sandbox", "push_type": "alert", "priority": 10, "expiration": 0, "collapse_id": "order-7", "payload": {"aps": {"alert": "Hello"}, "n": 1.50, "list": [1, -2.5e3, true, false, null, "x"], "o": {}}}"#,
        #"{"users": ["u1"], "tokens": [], "push_type": "background", "priority": 5, "payload": {"aps": {"content-available": 1}}}"#,
        #"{"users": [], "tokens": ["\#(token)"], "push_type": "voip", "expiration": 1796184000, "payload": {}}"#,
        #"{"topic": "com.example.other", "users": ["u"], "environment": "production", "payload": {}}"#,
        #"{"id": "", "users": ["u"], "payload": {}}"#,
        "\t{\r\n \"users\" : [ \"u1\" , \"u2\" ] ,\n\"payload\":{ \"aps\" : { } } }\n ",
        #"{"payload": {"aps": {}}, "users": ["u1"], "id": "last-first"}"#,
        #"{"users": ["u1"], "send_at": 1700000000, "deadline": 1798761600, "payload": {}}"#,
        #"{"users": ["u"], "payload": {"aps": {"alert": "caf\u00e9 \"quoted\" café"}}}"#
    ]

    @Test func usualJobsAreReadInOnePassAsMemberByMember() throws {
        for body in Self.usual {
            #expect(agree(body) != nil, "\(body)")
        }
        let job = try #require(agree(Self.usual[0]))
        #expect(job.id == "bench-7" && job.idFromBody && job.tokens == [Self.token] && job.topic == Self.topic)
        let fallback = try #require(agree(Self.usual[1]))
        #expect(fallback.id == "fallback" && !fallback.idFromBody, "a job without an id gets the caller's")
    }

    /// Everything outside the usual shape, valid or not, is left to the member-by-member reading (which then accepts
    /// it or names what is wrong with it).
    @Test func otherBodiesAreLeftToTheMemberByMemberReading() {
        let token = Self.token
        let declined = [
            #"{"id": "a\"b", "users": ["u"], "payload": {}}"#,
            #"{"id": "\u0041", "users": ["u"], "payload": {}}"#,
            #"{"id": "café", "users": ["u"], "payload": {}}"#,
            #"{"users": ["u"], "payload": {}, "sent_by": "billing"}"#,
            #"{"users": ["u"], "id": null, "payload": {}}"#,
            #"{"users": null, "tokens": ["\#(token)"], "payload": {}}"#,
            #"{"tokens": ["\#(token.uppercased())"], "payload": {}}"#,
            #"{"tokens": ["\#(token)0"], "payload": {}}"#,
            #"{"tokens": ["nothex"], "payload": {}}"#,
            #"{"tokens": ["\#(String(repeating: "0a", count: 31))0\u0061"], "payload": {}}"#,
            #"{"tokens": ["0a\"0a", "\#(token)"], "payload": {}}"#,
            #"{"tokens": ["\#(token)\\"], "payload": {}}"#,
            #"{"users": [""], "payload": {}}"#,
            #"{"users": ["\#(String(repeating: "u", count: 257))"], "payload": {}}"#,
            #"{"users": [1], "payload": {}}"#,
            #"{"users": ["u"], "send_at": 1700000000, "deadline": 1600000000, "payload": {}}"#,
            #"{"users": ["u"], "deadline": 99999999999999, "payload": {}}"#,
            #"{"users": ["u"], "users": ["v"], "payload": {}}"#,
            #"{"users": ["u"], "payload": {"a": 1, "a": 2}}"#,
            #"{"users": ["u"], "payload": []}"#,
            #"{"users": ["u"]}"#,
            #"{"payload": {}}"#,
            #"{"users": [], "tokens": [], "payload": {}}"#,
            #"{"users": ["u"], "priority": 10.0, "payload": {}}"#,
            #"{"users": ["u"], "priority": 1e1, "payload": {}}"#,
            #"{"users": ["u"], "priority": 7, "payload": {}}"#,
            #"{"users": ["u"], "priority": 010, "payload": {}}"#,
            #"{"users": ["u"], "expiration": -1, "payload": {}}"#,
            #"{"users": ["u"], "expiration": 99999999999999999999, "payload": {}}"#,
            #"{"users": ["u"], "push_type": "background", "priority": 10, "payload": {}}"#,
            #"{"users": ["u"], "push_type": "liveactivity", "payload": {}}"#,
            #"{"users": ["u"], "push_type": "smoke", "payload": {}}"#,
            #"{"users": ["u"], "environment": "staging", "payload": {}}"#,
            #"{"users": ["u"], "topic": "", "payload": {}}"#,
            #"{"users": ["u"], "topic": "not a bundle", "payload": {}}"#,
            #"{"users": ["u"], "collapse_id": "\#(String(repeating: "c", count: 65))", "payload": {}}"#,
            #"{"users": ["u"], "payload": {}} x"#,
            #"{"users": ["u"], "payload": {},}"#,
            #"{"users": ["u",], "payload": {}}"#,
            "\u{FEFF}" + #"{"users": ["u"], "payload": {}}"#,
            #"[{"users": ["u"], "payload": {}}]"#,
            #"{"users": ["u"], "payload": {"aps": {"alert": "\#(String(repeating: "x", count: 4100))"}}}"#
        ]
        for body in declined {
            #expect(agree(body) == nil, "\(body)")
        }
    }

    @Test func theLimitsAreTheMemberByMemberReadingsOnes() {
        let body = Self.usual[0]
        var exact = PushJob.Limits()
        exact.maximumMessageSize = body.utf8.count
        #expect(agree(body, limits: exact) != nil, "exactly as large as a message may be")
        var small = PushJob.Limits()
        small.maximumMessageSize = body.utf8.count - 1
        #expect(agree(body, limits: small) == nil, "larger than a message may be")
        var three = PushJob.Limits()
        three.maximumTargets = 3
        #expect(agree(Self.usual[1], limits: three) != nil, "as many targets as a job may have")
        var few = PushJob.Limits()
        few.maximumTargets = 2
        #expect(agree(Self.usual[1], limits: few) == nil, "more targets than a job may have")
        var unlimited = PushJob.Limits()
        (unlimited.maximumMessageSize, unlimited.maximumDepth, unlimited.maximumTargets) = (.max, .max, .max)
        #expect(agree(body, limits: unlimited) != nil, "no limit at all")
        var shallow = PushJob.Limits()
        shallow.maximumDepth = 3
        #expect(agree(#"{"users": ["u"], "payload": {"a": {"b": 1}}}"#, limits: shallow) != nil)
        #expect(agree(#"{"users": ["u"], "payload": {"a": {"b": {"c": 1}}}}"#, limits: shallow) == nil, "too deep")
        #expect(agree(#"{"users": ["u"], "payload": {"a": [[1]]}}"#, limits: shallow) == nil, "too deep")
    }

    @Test func edgesOfTheUsualShapeReadTheSameEitherWay() throws {
        let long = String(repeating: "ab", count: 100)
        let taken = [
            #"{"tokens": ["\#(long)"], "payload": {}}"#,
            #"{"id": "del\#u{7F}", "users": ["u\#u{7F}"], "payload": {}}"#,
            #"{"users": ["u"], "expiration": -0, "payload": {}}"#,
            #"{"users": ["u"], "expiration": 99999999999, "payload": {}}"#,
            #"{"users": ["u"], "push_type": "voip", "payload": \#(payload(of: APNsPushType.voip.maximumPayloadSize))}"#
        ]
        for body in taken {
            #expect(agree(body) != nil, "\(body)")
        }
        let background = try #require(agree(#"{"users": ["u"], "push_type": "background", "payload": {}}"#))
        #expect(background.priority == .considerPower, "a background push's own default priority")
        let over = payload(of: APNsPushType.voip.maximumPayloadSize + 1)
        #expect(
            agree(#"{"users": ["u"], "push_type": "voip", "payload": \#(over)}"#) == nil,
            "one byte over a VoIP payload's 5 KB")
        #expect(agree(#"{"users": ["u"], "expiration": -9223372036854775808, "payload": {}}"#) == nil)
        // Header values the rules judge: read both ways, whichever way that goes.
        agree(#"{"users": ["u"], "collapse_id": "", "payload": {}}"#)
        agree(#"{"users": ["u"], "collapse_id": "\#u{7F}", "payload": {}}"#)
        agree(#"{"users": ["u"], "collapse_id": " c", "payload": {}}"#)
        for defaultTopic in [nil, "", "not a bundle", "com.example.other"] {
            agree(#"{"users": ["u"], "payload": {}}"#, defaultTopic: defaultTopic)
            agree(#"{"users": ["u"], "topic": "com.example.app", "payload": {}}"#, defaultTopic: defaultTopic)
        }
        #expect(agree(#"{"users": ["u"], "payload": {}}"#, defaultTopic: nil) == nil, "no topic at all")
    }

    /// A campaign's users take one buffer of their size, not a doubling one of up to twice it (and both buffers while it
    /// grows): what a worker holding big bulk jobs has in memory.
    @Test func aCampaignsUsersTakeOneBufferOfTheirSize() throws {
        let users = (0..<10_000).map { "\"user-\($0)\"" }.joined(separator: ", ")
        let job = try #require(agree(#"{"users": [\#(users)], "payload": {}}"#))
        #expect(job.users.count == 10_000)
        #expect(job.users.capacity < job.users.count * 5 / 4, "capacity \(job.users.capacity)")
    }

    /// A payload of exactly `size` bytes.
    func payload(of size: Int) -> String {
        #"{"p": ""# + String(repeating: "x", count: size - 9) + #""}"#
    }

    /// `decode` makes the caller's fallback id once at most, and only for a job that names none.
    @Test func theFallbackIDIsMadeOnlyWhenNeeded() throws {
        var made = 0
        func fallback() -> String {
            made += 1
            return "made"
        }
        let named = try PushJob.decode(Array(Self.usual[0].utf8), defaultTopic: Self.topic, fallbackID: fallback())
        #expect(named.id == "bench-7" && made == 0)
        let unnamed = try PushJob.decode(Array(Self.usual[1].utf8), defaultTopic: Self.topic, fallbackID: fallback())
        #expect(unnamed.id == "made" && made == 1)
        let general = try PushJob.decode(
            Array(#"{"users": ["u"], "sent_by": "x", "payload": {}}"#.utf8), defaultTopic: Self.topic,
            fallbackID: fallback())
        #expect(general.id == "made" && made == 2, "read member by member, once")
    }

    /// Bodies put together at random from the usual members, their values, and values just outside them, with
    /// defaults and limits at random too: read both ways.
    @Test func bodiesOfRandomMembersReadTheSameEitherWay() {
        var random = Xorshift(state: 41)
        // For each member, values it takes (first) and values just outside them.
        let values: [String: (good: [String], bad: [String])] = [
            "id": ([#""j-1""#, #""""#], ["1", "null", #""a\"b""#]),
            "topic": ([#""com.example.app""#, #""com.example.other""#], [#""""#, #""not a bundle""#, "null"]),
            "users": ([#"["u1"]"#, "[]", #"["u1", "u2"]"#], [#"[""]"#, "[1]", "null", #""u""#]),
            "tokens": ([#"["\#(Self.token)"]"#, "[]"], [#"["\#(Self.token.uppercased())"]"#, #"["abc"]"#, "{}"]),
            "environment": ([#""sandbox""#, #""production""#], [#""staging""#, "0"]),
            "push_type": ([#""alert""#, #""background""#, #""voip""#], [#""liveactivity""#, #""smoke""#, "true"]),
            "priority": (["10", "5", "1", "-0"], ["7", "10.0", "1e1", #""10""#]),
            "expiration": (["0", "1796184000", "9223372036854775807"], ["-1", "9223372036854775808"]),
            "collapse_id": ([#""c""#], [#""""#, #""\#(String(repeating: "c", count: 65))""#]),
            "payload": (["{}", #"{"aps": {"alert": "x"}}"#, #"{"a": [[{}]]}"#], ["[]", #"{"a": 1, "a": 2}"#, "null"]),
            "deadline": (["1798761600", "1700000000"], ["-1", "99999999999999", "1e9"]),
            "send_at": (["1700000000"], ["-5", #""now""#])
        ]
        let names = values.keys.sorted()
        var taken = 0
        for _ in 0..<20_000 {
            var members: [String] = []
            for name in names where random.next(3) == 0 || name == "payload" || name == "users" {
                let (good, bad) = values[name]!
                let choices = good.isEmpty || random.next(12) == 0 ? bad : good
                guard !choices.isEmpty else { continue }
                members.append("\"\(name)\": \(choices[random.next(choices.count)])")
            }
            members.shuffle(using: &random)
            if random.next(30) == 0, let first = members.first { members.append(first) }
            let body = "{" + members.joined(separator: random.next(2) == 0 ? ", " : ",") + "}"
            var limits = PushJob.Limits()
            limits.maximumDepth = [2, 3, 4, 32, 32][random.next(5)]
            limits.maximumTargets = [1, 2, 100_000, 100_000][random.next(4)]
            limits.maximumMessageSize = [body.utf8.count, body.utf8.count - 1, 1 << 20, 1 << 20][random.next(4)]
            let defaultTopic = [Self.topic, Self.topic, nil, "com.example.other"][random.next(4)]
            if agree(body, defaultTopic: defaultTopic, limits: limits) != nil { taken += 1 }
        }
        #expect(taken > 1_000, "\(taken) of 20,000 read in one pass")
    }

    @Test func everyJobOfTheCorpusReadsTheSameEitherWay() {
        var taken = 0
        for body in JobCorpus.accepted + JobCorpus.refused.map(\.0) + JobCorpus.beyondTheSchema.map(\.body) {
            if agree(body) != nil { taken += 1 }
        }
        #expect(taken >= 4, "corpus jobs read in one pass: \(taken)")
    }

    /// Each usual job with one byte changed, dropped or added, at every place: thousands of bodies near the usual
    /// shape, inside it or just outside, each read both ways.
    @Test func bodiesOneByteAwayReadTheSameEitherWay() {
        let replacements = Array(#"{}[]":,"\ 0aA-.e"#.utf8) + [0x00, 0x1F, 0x7F, 0xC3, 0xFF]
        var taken = 0
        var checked = 0
        for text in Self.usual {
            let body = Array(text.utf8)
            for index in body.indices {
                var variants: [[UInt8]] = []
                var dropped = body
                dropped.remove(at: index)
                variants.append(dropped)
                for byte in replacements {
                    var changed = body
                    changed[index] = byte
                    variants.append(changed)
                    var added = body
                    added.insert(byte, at: index)
                    variants.append(added)
                }
                for variant in variants {
                    checked += 1
                    if agree(variant) != nil { taken += 1 }
                }
            }
        }
        #expect(taken > 0 && taken < checked, "both readings were exercised: \(taken) of \(checked) read in one pass")
    }
}
