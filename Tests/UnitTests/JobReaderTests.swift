import APNs
import Configuration
import Foundation
import HTTP2
import Operations
import Telemetry
import Testing
import WorkerPipeline

@Suite struct JobReaderTests {
    func reader(_ text: String, lineLimit: Int = 1 << 20) throws -> JobReader {
        try JobReader(path: try TemporaryText.file(text), lineLimit: lineLimit)
    }

    /// Jobs as (line, body); an over-limit line as (line, "OVER LIMIT").
    func all(_ text: String, lineLimit: Int = 1 << 20) throws -> [(line: Int, body: String)] {
        var reader = try reader(text, lineLimit: lineLimit)
        var jobs: [(Int, String)] = []
        while let entry = try reader.next() {
            switch entry {
            case .job(let line, let body): jobs.append((line, String(decoding: body, as: UTF8.self)))
            case .overLimit(let line): jobs.append((line, "OVER LIMIT"))
            }
        }
        return jobs
    }

    @Test func aLineOverTheLimitIsRefusedAndTheNextLinesRead() throws {
        let long = String(repeating: "x", count: 100)
        let jobs = try all("{\"a\": 1}\n\(long)\n{\"b\": 2}\n\(long)", lineLimit: 40)
        #expect(jobs.map(\.line) == [1, 2, 3, 4])
        #expect(jobs.map(\.body) == ["{\"a\": 1}", "OVER LIMIT", "{\"b\": 2}", "OVER LIMIT"])
        #expect(
            try all(String(repeating: "y", count: 40) + "\n", lineLimit: 40).map(\.body) == [
                String(repeating: "y", count: 40)
            ],
            "a line of exactly the limit is taken")
    }

    /// A line that never ends (`/dev/zero`): refused once past the limit, then the reading stops with bounded memory.
    @Test func aLineWithoutEndStopsTheReading() throws {
        var reader = try JobReader(path: "/dev/zero", lineLimit: 1 << 20)
        #expect(try reader.next() == .overLimit(line: 1))
        #expect(throws: JobReaderError.self) { try reader.next() }
        #expect(reader.bytesRead > JobReader.maximumSkipped && reader.bytesRead <= JobReader.maximumSkipped + (2 << 20))
    }

    /// Many short lines arriving in one read are each found once: a million of them take a moment, not minutes.
    @Test func manyLinesInOneReadAreEachTakenOnce() throws {
        let text = String(repeating: "{}\n", count: 200_000)
        #expect(try all(text).count == 200_000)
    }

    @Test func jsonLinesKeepTheirLineNumbers() throws {
        let jobs = try all("{\"a\": 1}\n\n   \n{\"b\": 2}\r\nnot json\n{\"c\": 3}")
        #expect(jobs.map(\.line) == [1, 4, 5, 6], "blank lines skipped, numbers kept")
        #expect(jobs[1].body == "{\"b\": 2}\r", "bodies unchanged (the checks judge them)")
        #expect(jobs[3].body == "{\"c\": 3}", "a last line without a newline counts")
    }

    @Test func aPrettyPrintedFileIsOneJob() throws {
        let jobs = try all("{\n  \"users\": [\"u1\"],\n  \"payload\": {}\n}\n")
        #expect(jobs.count == 1 && jobs[0].line == 1)
        #expect(jobs[0].body.contains("\"payload\": {}"))
    }

    @Test func aMissingFileIsNamed() {
        #expect(throws: JobReaderError.self) { try JobReader(path: "/nonexistent/jobs.jsonl") }
    }

    @Test func theSizeIsKnownForProgress() throws {
        var reader = try reader("{\"a\": 1}\n")
        #expect(reader.totalBytes == 9)
        _ = try reader.next()
        #expect(reader.bytesRead == 9)
    }
}
