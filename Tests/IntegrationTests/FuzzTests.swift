import APNs
import Foundation
import JSON
import Telemetry
import Testing
import WorkerPipeline

/// Generator-driven fuzzing of everything that reads input from outside: job bodies, registration and dead-token
/// events, APNs error bodies, raw JSON. Mutations of valid inputs (byte flips, insertions, deletions, splices,
/// truncations, invalid UTF-8, deep nesting, huge numbers) must each end in a value that keeps the invariants or in
/// an error that says what is wrong: never a crash, never a silent acceptance of a broken job.
///
/// FUZZ_ITERATIONS (default 20,000 per target) and FUZZ_SEED (default fixed, so a finding is reproducible) tune it;
/// `scripts/fuzz` runs it longer with a random seed.
@Suite struct FuzzTests {
    static let iterations = Int(ProcessInfo.processInfo.environment["FUZZ_ITERATIONS"] ?? "") ?? 20_000
    static let seed = UInt64(ProcessInfo.processInfo.environment["FUZZ_SEED"] ?? "") ?? 0x5EED_A9F5

    static let token = String(repeating: "ab", count: 32)
    static let jobs = [
        #"{"id": "j1", "users": ["alice", "bob"], "payload": {"aps": {"alert": "Hello"}}}"#,
        #"{"tokens": ["\#(token)"], "environment": "sandbox", "push_type": "background", "priority": 5, "payload": {"aps": {"content-available": 1}}}"#,
        #"{"id": "j3", "topic": "com.example.app.voip", "users": ["u"], "push_type": "voip", "expiration": 1700000000, "collapse_id": "c", "payload": {"k": [1, 2.5e3, -0, true, null, "\u00e9\ud83d\ude00"]}}"#,
        #"{"id": "j4", "retry": {"attempt": 2, "targets": [{"token": "\#(token)", "environment": "production", "user": "u"}]}, "topic": "t", "payload": {"aps": {}}}"#,
        #"{"users": ["u"], "prevalidate": true, "payload": {"aps": {"alert": {"title": "T", "body": "B"}}}}"#
    ].map { Array($0.utf8) }

    /// One random change to `input`, drawing on `corpus` for splices.
    static func mutate(_ input: [UInt8], corpus: [[UInt8]], using generator: inout SeededGenerator) -> [UInt8] {
        var bytes = input
        let interesting: [[UInt8]] = [
            Array("\"".utf8), Array("\\".utf8), Array("{".utf8), Array("}".utf8), Array("[".utf8),
            Array("]".utf8), Array(":".utf8), Array(",".utf8), Array("null".utf8),
            Array("1e999999".utf8), Array("-".utf8), Array("\\u".utf8), Array("\\ud800".utf8),
            [0xFF], [0xC0, 0x80], [0xED, 0xA0, 0x80], [0], Array("99999999999999999999".utf8),
            Array(repeating: UInt8(ascii: "["), count: 5_000)
        ]
        let position = bytes.isEmpty ? 0 : Int.random(in: 0..<bytes.count, using: &generator)
        switch Int.random(in: 0..<7, using: &generator) {
        case 0 where !bytes.isEmpty: bytes[position] ^= UInt8.random(in: 1...255, using: &generator)
        case 1: bytes.insert(contentsOf: interesting.randomElement(using: &generator)!, at: position)
        case 2 where !bytes.isEmpty:
            let end = min(bytes.count, position + Int.random(in: 1...16, using: &generator))
            bytes.removeSubrange(position..<end)
        case 3: bytes = Array(bytes.prefix(position))
        case 4:
            let other = corpus.randomElement(using: &generator)!
            let cut = other.isEmpty ? 0 : Int.random(in: 0..<other.count, using: &generator)
            bytes = Array(bytes.prefix(position)) + other.suffix(from: cut)
        case 5 where !bytes.isEmpty:
            let end = min(bytes.count, position + Int.random(in: 1...32, using: &generator))
            bytes.insert(contentsOf: bytes[position..<end], at: position)
        default: bytes.insert(UInt8.random(in: 0...255, using: &generator), at: position)
        }
        return bytes
    }

    /// Runs `check` over `iterations` mutants (stacked up to four mutations deep); returns how many were accepted.
    @discardableResult
    static func fuzz(_ name: String, corpus: [[UInt8]], _ check: ([UInt8]) -> Bool) -> (runs: Int, accepted: Int) {
        // Each target its own stream from the seed, so adding a target does not change the others' inputs.
        var generator = SeededGenerator(state: seed)
        for byte in name.utf8 { generator.state = generator.state &* 31 &+ UInt64(byte) }
        var accepted = 0
        for _ in 0..<iterations {
            var input = corpus.randomElement(using: &generator)!
            for _ in 0..<Int.random(in: 1...4, using: &generator) {
                input = mutate(input, corpus: corpus, using: &generator)
            }
            if check(input) { accepted += 1 }
        }
        print(
            "fuzz \(name): \(iterations) inputs (seed \(seed)), \(accepted) accepted, \(iterations - accepted) refused with a reason"
        )
        return (iterations, accepted)
    }

    @Test func jobBodies() {
        var broken: [String] = []
        let result = Self.fuzz("job decoder", corpus: Self.jobs) { body in
            do {
                let job = try PushJob.decode(body, defaultTopic: "com.example.app", fallbackID: "fallback")
                // What is accepted is a job the worker can act on.
                let targets = job.retryTargets?.count ?? (job.users.count + job.tokens.count)
                if targets == 0 || job.topic.isEmpty || job.payload.count > job.pushType.maximumPayloadSize {
                    broken.append(String(decoding: body, as: UTF8.self))
                }
                // And its retry form reads back with the same targets and payload.
                if let targetList = job.retryTargets {
                    let again = try PushJob.decode(
                        job.retryBody(targets: targetList, original: body), defaultTopic: nil,
                        fallbackID: "")
                    if again.retryTargets != targetList || again.payload != job.payload
                        || again.originalBody != (job.originalBody ?? body)
                    {
                        broken.append("retry round trip")
                    }
                }
                return true
            } catch {
                if "\(error)".isEmpty { broken.append("an error without a reason") }
                return false
            }
        }
        #expect(broken.isEmpty, "\(broken.prefix(3))")
        #expect(result.accepted > 0 && result.accepted < result.runs, "the mutants reach both sides")
    }

    @Test func registrationAndDeadTokenEvents() {
        let registrations = [
            #"{"user": "u1", "token": "\#(Self.token)", "environment": "sandbox", "timestamp": 1732900000000, "device": {"model": "iPhone15,2"}, "action": "register"}"#,
            #"{"user": "u2", "token": "\#(Self.token)", "action": "unregister"}"#
        ].map { Array($0.utf8) }
        var broken: [String] = []
        Self.fuzz("registration events", corpus: registrations) { body in
            do {
                let event = try RegistrationEvent.decode(body, now: 1_796_184_000_000)
                if event.registration.user.isEmpty || event.registration.registeredAt <= 0 {
                    broken.append("accepted empty")
                }
                if try RegistrationEvent.decode(event.json, now: 1_796_184_000_000) != event {
                    broken.append("round trip")
                }
                return true
            } catch {
                if "\(error)".isEmpty { broken.append("an error without a reason") }
                return false
            }
        }
        let event = DeadTokenEvent(
            token: Self.token, user: "u", topic: "t", environment: .production, status: 410,
            reason: "Unregistered", timestamp: 1_732_900_000_000, jobID: "j")
        Self.fuzz("dead-token events", corpus: [event.json]) { body in
            guard let decoded = try? DeadTokenEvent.decode(body) else { return false }
            if (try? DeadTokenEvent.decode(decoded.json)) != decoded { broken.append("dead-token round trip") }
            return true
        }
        #expect(broken.isEmpty, "\(broken.prefix(3))")
    }

    /// What an APNs server sends back in a body: anything at all ends as a reason or nothing, and whenever both the
    /// project's strict reader and an independent one (Foundation's, more lenient: it takes trailing commas) read
    /// the body as an object, they find the same reason and timestamp. Bodies with a name twice are left out: that
    /// JSON is ambiguous, and parsers may keep either.
    @Test func apnsErrorBodies() {
        let bodies = [
            #"{"reason": "BadDeviceToken"}"#, #"{"reason": "Unregistered", "timestamp": 1732900000000}"#, "<html>"
        ]
        .map { Array($0.utf8) }
        var disagreements: [String] = []
        let result = Self.fuzz("APNs error bodies", corpus: bodies) { body in
            let (reason, timestamp) = APNsResponse.parseBody(body)
            let names = (try? JSONReader.parse(body)).flatMap { document -> [String]? in
                if case .object(let members) = document { members.map(\.key) } else { nil }
            }
            if let names, Set(names).count == names.count,
                let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
                let text = object["reason"] as? String
            {
                // Compared where Foundation holds an exact whole number (a double loses digits past 2^53).
                let foundationTimestamp = (object["timestamp"] as? NSNumber).flatMap { Int64($0.stringValue) }
                if reason?.rawValue != text || (foundationTimestamp != nil && timestamp != foundationTimestamp) {
                    disagreements.append(String(decoding: body, as: UTF8.self))
                }
            }
            return reason != nil
        }
        #expect(disagreements.isEmpty, "\(disagreements.prefix(3))")
        #expect(result.accepted > 0, "the mutants reach the accepted side")
    }

    /// The reader keeps each member's byte range so that a payload is forwarded exactly as written: whatever it
    /// accepts, every member's range must hold that member's value and nothing else.
    @Test func rawJSONKeepsExactMemberRanges() {
        var broken: [String] = []
        // Ranges inside a re-read value count from its own start, so values are compared by content only.
        func content(_ value: JSONValue) -> String {
            switch value {
            case .null: "null"
            case .bool(let flag): "\(flag)"
            case .number(let text): "#" + text
            case .string(let text): JSONString.quote(text)
            case .array(let elements): "[" + elements.map(content).joined(separator: ",") + "]"
            case .object(let members):
                "{" + members.map { JSONString.quote($0.key) + ":" + content($0.value) }.joined(separator: ",") + "}"
            }
        }
        func check(_ value: JSONValue, in body: [UInt8]) {
            switch value {
            case .object(let members):
                for member in members {
                    if (try? JSONReader.parse(Array(body[member.range]))).map(content) != content(member.value) {
                        broken.append("member \(member.key) of \(String(decoding: body, as: UTF8.self))")
                    }
                    check(member.value, in: body)
                }
            case .array(let elements): for element in elements { check(element, in: body) }
            default: break
            }
        }
        let result = Self.fuzz("raw JSON reader", corpus: Self.jobs) { body in
            guard let document = try? JSONReader.parse(body) else { return false }
            check(document, in: body)
            return true
        }
        #expect(broken.isEmpty, "\(broken.prefix(3))")
        #expect(result.accepted > 0, "the mutants reach the accepted side")
    }

    /// Nesting far beyond the limit is refused by depth, not by exhausting the stack.
    @Test func deepNestingIsRefusedNotFollowed() {
        let deep =
            Array(repeating: UInt8(ascii: "["), count: 1_000_000)
            + Array(repeating: UInt8(ascii: "]"), count: 1_000_000)
        #expect(throws: JSONError.self) { try JSONReader.parse(deep) }
        let job = Array(#"{"users": ["u"], "payload": "#.utf8) + deep + Array("}".utf8)
        #expect(throws: JobError.self) { try PushJob.decode(job, defaultTopic: "t", fallbackID: "") }
    }
}
