import Foundation
import Testing

/// The shape a newcomer relies on: no source file longer than a sitting's read, and each test suite in a file of its
/// own name.
@Suite struct CodeShapeTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static func swiftFiles(under folder: String) throws -> [URL] {
        let enumerator = try #require(
            FileManager.default.enumerator(
                at: root.appendingPathComponent(folder),
                includingPropertiesForKeys: nil))
        return enumerator.compactMap { $0 as? URL }.filter { $0.pathExtension == "swift" }
    }

    @Test func noSourceFileIsLongerThan600Lines() throws {
        let files = try Self.swiftFiles(under: "Sources")
        #expect(files.count > 100, "the sources were found")
        for file in files {
            let lines = try String(contentsOf: file, encoding: .utf8).split(
                separator: "\n", omittingEmptySubsequences: false)
            #expect(lines.count <= 601, "\(file.lastPathComponent): \(lines.count) lines")
        }
    }

    @Test func eachSuiteHasAFileOfItsName() throws {
        let files = try Self.swiftFiles(under: "Tests")
        for file in files {
            let text = try String(contentsOf: file, encoding: .utf8)
            let suites = text.matches(of: /(?m)^(?:@Suite[^\n]*\n?)?(?:final )?(?:struct|class|enum) (\w+Tests)\b/).map
            {
                String($0.1)
            }
            #expect(suites.count <= 1, "\(file.lastPathComponent) holds \(suites)")
            if let suite = suites.first {
                #expect(
                    file.deletingPathExtension().lastPathComponent == suite, "\(suite) in \(file.lastPathComponent)")
            }
        }
    }

    /// The values made for every job, target and answer spell their optional stored fields `Optional<T>`: a `var`
    /// written `T?` is nil before an explicit initializer sets it, and the optimizer then built the whole value twice,
    /// copying one (a reference count for each string and array in it) and destroying the other. Written out, the
    /// field starts unset and is initialized once: about 1,000 instructions a single-token job in scripts/profile
    /// (docs/performance.md). Nothing else shows the copy coming back.
    @Test func valuesMadePerJobSpellTheirOptionalsOut() throws {
        let values = [
            ("Sources/AMQP/AMQPMessages.swift", "AMQPProperties"),
            ("Sources/WorkerPipeline/BrokerMessages.swift", "MessageProperties"),
            ("Sources/APNsModel/APNsNotification.swift", "Message"),
            ("Sources/APNsModel/APNsOutcome.swift", "APNsResponse"),
            ("Sources/WorkerPipeline/Tokens.swift", "DeviceTarget"),
            ("Sources/WorkerPipeline/TokenScope.swift", "TokenScope")
        ]
        for (path, name) in values {
            let lines = try String(contentsOf: Self.root.appendingPathComponent(path), encoding: .utf8).split(
                separator: "\n", omittingEmptySubsequences: false)
            let start = try #require(lines.firstIndex { $0.contains("struct \(name):") }, "\(name) in \(path)")
            let indent = lines[start].prefix { $0 == " " }
            let end = try #require(lines[start...].firstIndex { $0 == indent + "}" }, "the end of \(name)")
            // The type's own fields: one indent in, a type annotation, no accessor block.
            let stored = lines[start..<end].filter { line in
                line.hasPrefix(indent + "    ") && !line.hasPrefix(indent + "     ") && line.contains("var ")
                    && line.contains(": ") && !line.contains("{")
            }
            #expect(stored.count >= 2, "\(name)'s stored fields were found")
            let shorthand = stored.filter { $0.range(of: #"\?\s*(=.*)?$"#, options: .regularExpression) != nil }
            #expect(shorthand.isEmpty, "\(name) in \(path): \(shorthand)")
        }
    }
}
