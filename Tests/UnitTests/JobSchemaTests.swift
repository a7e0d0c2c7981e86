import Foundation
import RedisStore
import Testing
import WorkerPipeline

/// `schema/job.schema.json` against the worker's own decoder, checked by an independent validator (Debian's
/// python3-jsonschema, draft 2020-12, through scripts/lib/json-schema-check): the docs' examples validate, and on
/// the decoder tests' corpus the two agree on accept or refuse, except for what a schema cannot express (listed
/// in `JobCorpus.beyondTheSchema` and in docs/contract.md).
@Suite struct JobSchemaTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    enum Verdict: Equatable {
        case valid
        case invalid(String)
        case unparsable(String)

        var accepts: Bool { self == .valid }
    }

    /// Each document checked against the schema's `definition` ("-": the job, the schema's root).
    static func schemaVerdicts(
        _ documents: [(definition: String, text: String)],
        schema: String = "job.schema.json"
    ) throws -> [Verdict] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: root + "/scripts/lib/json-schema-check")
        process.arguments = [root + "/schema/" + schema]
        let input = Pipe()
        let output = Pipe()
        let errors = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let lines = documents.map { "\($0.definition)\t\(Data($0.text.utf8).base64EncodedString())\n" }.joined()
        // Written from another thread: the checker answers line by line and could fill its output pipe meanwhile.
        Thread {
            input.fileHandleForWriting.write(Data(lines.utf8))
            try? input.fileHandleForWriting.close()
        }.start()
        let answer = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let problem = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        guard process.terminationStatus == 0 else {
            throw TestFailure(description: "json-schema-check exited \(process.terminationStatus): \(problem)")
        }
        let verdicts = answer.split(separator: "\n").map { line -> Verdict in
            if line == "valid" { return .valid }
            if line.hasPrefix("unparsable") { return .unparsable(String(line)) }
            return .invalid(String(line))
        }
        guard verdicts.count == documents.count else {
            throw TestFailure(
                description: "\(documents.count) documents, \(verdicts.count) answers: \(answer) \(problem)")
        }
        return verdicts
    }

    struct TestFailure: Error, CustomStringConvertible { let description: String }

    static func decoderAccepts(_ job: String) -> Bool {
        (try? PushJob.decode(Array(job.utf8), defaultTopic: "com.example.app", fallbackID: "x")) != nil
    }

    @Test func theSchemaAndTheDecoderAgreeOnTheCorpus() throws {
        let beyond = JobCorpus.beyondTheSchema.map(\.body)
        let jobs =
            JobCorpus.accepted + JobCorpus.refused.map(\.0)
            + JobCorpus.refusedLiveActivities.map { JobCorpus.liveActivityJob($0.0) } + beyond
        let verdicts = try Self.schemaVerdicts(jobs.map { ("-", $0) })
        #expect(jobs.count > 60, "the corpus is the decoder tests' rows")
        for (job, verdict) in zip(jobs, verdicts) {
            let decoder = Self.decoderAccepts(job)
            if let why = JobCorpus.beyondTheSchema.first(where: { $0.body == job })?.why {
                #expect(
                    !decoder && verdict.accepts,
                    "beyond the schema (\(why)) means: the decoder refuses, the schema cannot: \(job.prefix(200))")
            } else {
                #expect(
                    decoder == verdict.accepts,
                    "decoder \(decoder ? "accepts" : "refuses"), schema: \(verdict): \(job.prefix(300))")
            }
        }
        for job in JobCorpus.accepted { #expect(Self.decoderAccepts(job), "\(job)") }
    }

    /// Every JSON object README.md and docs/contract.md show as a job, a registration event or a dead-token event (in ```json blocks and
    /// in inline code), with the kind its keys say.
    static func documentedExamples() throws -> [(definition: String, text: String)] {
        let readme = try ["/README.md", "/docs/contract.md"].map {
            try String(contentsOfFile: root + $0, encoding: .utf8)
        }
        .joined(separator: "\n")
        var candidates: [String] = []
        var rest = Substring(readme)
        while let open = rest.range(of: "```json\n") {
            guard let close = rest[open.upperBound...].range(of: "```") else { break }
            candidates.append(String(rest[open.upperBound..<close.lowerBound]))
            rest = rest[close.upperBound...]
        }
        let prose = readme.replacing(/```[\s\S]*?```/, with: "")
        candidates += prose.matches(of: /`(\{[^`]*\})`/).map { String($0.1) }
        return candidates.compactMap { text in
            guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
                return nil
            }
            let keys = Set(object.keys)
            if keys.isSuperset(of: ["token", "status"]) { return ("dead_token_event", text) }
            if keys.isSuperset(of: ["token", "user"]) { return ("registration_event", text) }
            if !keys.isDisjoint(with: ["users", "tokens", "activity", "channel_id"]) { return ("-", text) }
            return nil
        }
    }

    @Test func everyExampleInTheDocsValidates() throws {
        let examples = try Self.documentedExamples()
        let kinds = Dictionary(grouping: examples, by: \.definition).mapValues(\.count)
        #expect(
            (kinds["-"] ?? 0) >= 6 && (kinds["registration_event"] ?? 0) >= 2 && (kinds["dead_token_event"] ?? 0) >= 1,
            "the docs' examples were found: \(kinds)")
        for (example, verdict) in zip(examples, try Self.schemaVerdicts(examples)) {
            #expect(verdict == .valid, "\(example.definition): \(verdict): \(example.text)")
            if example.definition == "-" {
                #expect(Self.decoderAccepts(example.text), "the worker accepts it: \(example.text)")
            }
        }
    }

    /// The schema's own examples are the docs': each validates, and each job among them is one the worker accepts.
    @Test func theSchemasExamplesAreTheDocsAndValidate() throws {
        let schema = try #require(
            try JSONSerialization.jsonObject(
                with: Data(contentsOf: URL(fileURLWithPath: Self.root + "/schema/job.schema.json"))) as? [String: Any])
        let definitions = try #require(schema["$defs"] as? [String: Any])
        var examples: [(definition: String, text: String)] = []
        for (name, definition) in [
            ("-", "job"), ("registration_event", "registration_event"),
            ("dead_token_event", "dead_token_event")
        ] {
            let entries = try #require(
                (definitions[definition] as? [String: Any])?["examples"] as? [Any], "\(definition)")
            examples += try entries.map {
                (name, String(decoding: try JSONSerialization.data(withJSONObject: $0), as: UTF8.self))
            }
        }
        for (example, verdict) in zip(examples, try Self.schemaVerdicts(examples)) {
            #expect(verdict == .valid, "\(example.definition): \(verdict): \(example.text)")
            if example.definition == "-" { #expect(Self.decoderAccepts(example.text), "\(example.text)") }
        }
        func parsed(_ text: String) -> NSDictionary? {
            try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? NSDictionary
        }
        let inSchema = examples.compactMap { parsed($0.text) }
        for example in try Self.documentedExamples() {
            #expect(
                inSchema.contains { $0.isEqual(parsed(example.text)) },
                "the docs' example is in the schema: \(example.text)")
        }
    }
}
