import AMQP
import APNs
import Configuration
import Foundation
import HTTP2
import JSON
import Redis
import ServiceURLs
import Telemetry
import Testing
import WorkerPipeline

/// Unknown setting names: a typo in a file or `--set` stops start-up with the nearest known key; the environment's
/// strays are warned about.
@Suite struct SettingKeysTests {
    @Test(arguments: [
        ("APNS_RATELIMIT", "APNS_RATE_LIMIT"), ("WORKER_PREFECTH", "WORKER_PREFETCH"),
        ("apns_topic", "APNS_TOPIC"), ("REDIS_ULR", "REDIS_URL")
    ])
    func aTypoIsAnErrorNamingTheNearestKey(typo: String, meant: String) {
        do {
            try SettingKeys.checkKnown([typo], source: "given with --set")
            Issue.record("\(typo) accepted")
        } catch {
            #expect(error.key == typo && error.problem.contains("did you mean \(meant)?"), "\(error)")
        }
    }

    @Test func aNameNothingResemblesPointsToTheReference() {
        #expect(throws: ConfigurationError.self) { try SettingKeys.checkKnown(["COMPLETELY_DIFFERENT"], source: "x") }
        #expect(SettingKeys.suggestion(for: "COMPLETELY_DIFFERENT").contains("config/apns-worker.env"))
    }

    @Test func onlyOurPrefixesAreWarnedAboutInTheEnvironment() {
        let warnings = SettingKeys.unknownInEnvironment([
            "APNS_RATELIMIT": "1", "PATH": "/bin", "HOME": "/root",
            "AMQP_URL": "amqp://x", "PUSH_JOBS_QUEUEE": "q"
        ])
        #expect(warnings.count == 2)
        #expect(warnings.contains { $0.hasPrefix("APNS_RATELIMIT") && $0.contains("APNS_RATE_LIMIT") })
        #expect(warnings.contains { $0.hasPrefix("PUSH_JOBS_QUEUEE") })
    }

    /// docs/operations.md's Environment table names settings that exist: a renamed or removed key cannot linger there.
    @Test func theOperationsGuideNamesOnlySettingsOfTheTable() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
        let guide = try String(contentsOfFile: root + "/docs/operations.md", encoding: .utf8)
        let section = try #require(
            guide.components(separatedBy: "## Environment").dropFirst().first?
                .components(separatedBy: "\n\n").dropFirst().first, "docs/operations.md has an Environment table")
        let named = section.split(separator: "\n").filter { $0.hasPrefix("| ") && !$0.hasPrefix("| variable") }
            .flatMap { row in
                row.split(separator: "|")[0].split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            }
        let known = Set(SettingTable.entries.map(\.name))
        #expect(named.count >= 20, "the table was read: \(named)")
        #expect(named.filter { !known.contains($0) } == [], "docs/operations.md names settings no program reads")
    }

    /// config/apns-worker.env documents the table: every key of the table and no other, and where the file sets a
    /// value (a line not commented out), it is the table's default; every default of the table is set there.
    @Test func theReferenceFileDocumentsExactlyTheTable() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
        let text = try String(contentsOfFile: root + "/config/apns-worker.env", encoding: .utf8)
        var documented: Set<String> = []
        var defaults: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let commented = line.hasPrefix("#")
            let setting = line.drop { $0 == "#" || $0 == " " }
            guard let equals = setting.firstIndex(of: "="), case let key = String(setting[..<equals]), !key.isEmpty,
                key.allSatisfy({ $0.isUppercase || $0.isNumber || $0 == "_" })
            else { continue }
            documented.insert(key)
            if !commented { defaults[key] = String(setting[setting.index(after: equals)...]) }
        }
        let table = Dictionary(uniqueKeysWithValues: SettingTable.entries.map { ($0.name, $0) })
        #expect(
            documented == Set(table.keys),
            """
            undocumented: \(Set(table.keys).subtracting(documented).sorted()), \
            not in the table: \(documented.subtracting(table.keys).sorted())
            """)
        for (key, value) in defaults.sorted(by: { $0.key < $1.key }) {
            #expect(
                table[key]?.defaultText == value,
                "\(key)=\(value) in the file, \(table[key]?.defaultText ?? "no default") in the table")
        }
        for entry in SettingTable.entries where entry.defaultText != nil {
            #expect(defaults[entry.name] != nil, "\(entry.name)'s default \(entry.defaultText!) is not set in the file")
        }
    }

    /// Each key declared once, and the unknown-key check knows exactly the table's keys.
    @Test func theTableDeclaresEachKeyOnce() {
        let names = SettingTable.entries.map(\.name)
        #expect(
            names.count == Set(names).count,
            "declared twice: \(names.filter { name in names.count { $0 == name } > 1 })")
        #expect(SettingKeys.all == Set(names))
        #expect(names.count >= 41)
    }

    /// A program's --help lists the settings it reads, with the kind of value and the default, and no others.
    @Test func helpListsTheSettingsAProgramReads() {
        let tokens = SettingTable.help(for: .tokens)
        #expect(
            tokens.contains("REDIS_URL") && tokens.contains("APNS_TOPIC") && tokens.contains("LOG_LEVEL"), "\(tokens)")
        #expect(!tokens.contains("AMQP_URL") && !tokens.contains("WORKER_PREFETCH"), "\(tokens)")
        let worker = SettingTable.help(for: .worker)
        #expect(worker.contains("APNS_CONNECTIONS") && worker.contains("whole number 1..64; default 2"), "\(worker)")
        #expect(worker.split(separator: "\n").allSatisfy { $0.count <= 118 }, "\(worker)")
        let programs: [Programs] = [.worker, .cleanup, .enqueue, .tokens, .stats, .deadTokensTail]
        for program in programs {
            let listed = Set(
                SettingTable.help(for: program).split(separator: "\n").compactMap { line in
                    line.hasPrefix("  ") && !line.hasPrefix("   ")
                        ? line.split(separator: " ").first.map(String.init) : nil
                })
            #expect(listed == Set(SettingTable.entries.filter { $0.readers.contains(program) }.map(\.name)))
        }
        #expect(SettingTable.entries.allSatisfy { !$0.readers.isEmpty }, "every setting is read by some program")
    }

    /// Foundation reads a settings or key file past a byte-order mark; JSON read as bytes names it.
    @Test func aByteOrderMarkIsNamedInJSON() {
        do {
            _ = try JSONReader.parse([0xEF, 0xBB, 0xBF] + Array(#"{"users": ["u"]}"#.utf8))
            Issue.record("a BOM was accepted")
        } catch {
            #expect(error.description.contains("byte-order mark") && !error.description.contains("ï"), "\(error)")
        }
    }

    @Test func aDirectoryGivenAsAKeyFileIsNamed() {
        do {
            _ = try WorkerConfiguration.load(from: [
                "APNS_KEY_FILE": NSTemporaryDirectory(), "APNS_KEY_ID": "ABC123DEFG",
                "APNS_TEAM_ID": "DEF123GHIJ"
            ])
            Issue.record("a directory was accepted as a key file")
        } catch {
            #expect(error.key == "APNS_KEY_FILE" && error.problem.contains("is a directory, not a file"), "\(error)")
        }
    }
}
