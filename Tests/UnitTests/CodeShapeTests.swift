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
}
