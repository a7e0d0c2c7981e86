import APNs
import Foundation
import JSON
import WorkerPipeline

/// Splits input into jobs without holding more than one chunk and one job in memory: JSON Lines (a job per line,
/// blank lines skipped), or, when the first line does not hold a whole JSON value, one pretty-printed job.
public struct JobReader {
    /// The largest input taken as a single multi-line job (the worker's message limit is far below).
    public static let maximumSingleJob = 4 << 20

    /// A line longer than this is refused as soon as it passes it (the worker's message limit), and skipped.
    public let lineLimit: Int
    /// A line still without an end after this many bytes: the input is not JSON Lines (`/dev/zero`), reading stops.
    public static let maximumSkipped = 64 << 20

    private let handle: FileHandle
    public let totalBytes: Int?
    public private(set) var bytesRead = 0
    /// Input read and not yet taken: the current line starts at `head`, and `scanned` bytes of it hold no line end
    /// (each byte is searched once, however slowly a long line arrives).
    private var buffer: [UInt8] = []
    private var head = 0
    private var scanned = 0
    /// The over-limit line being skipped to its end, and how much of it has gone by.
    private var skipping: (line: Int, bytes: Int)?
    /// Where each read lands.
    private var scratch = [UInt8](repeating: 0, count: 1 << 20)
    private var lineNumber = 0
    private var finished = false
    private var mode: Mode = .undecided

    private enum Mode { case undecided, lines, single }

    /// What the input holds next.
    public enum Entry: Equatable, Sendable {
        case job(line: Int, body: [UInt8])
        /// A line that passed `lineLimit`: refused without being held, the rest of it skipped.
        case overLimit(line: Int)
    }

    public init(path: String, lineLimit: Int = PushJob.Limits().maximumMessageSize) throws {
        self.lineLimit = lineLimit
        if path == "-" {
            handle = .standardInput
            totalBytes = nil
        } else {
            guard let opened = FileHandle(forReadingAtPath: path) else {
                throw JobReaderError("cannot open \(path) for reading")
            }
            handle = opened
            let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? nil
            totalBytes = size
        }
    }

    /// The next job (or over-limit line) and the line it starts on, or nil at the end of the input.
    public mutating func next() throws -> Entry? {
        while mode != .single {
            if let newline = buffer[(head + scanned)...].firstIndex(of: UInt8(ascii: "\n")) {
                let line = buffer[head..<newline]
                head = newline + 1
                scanned = 0
                guard skipping == nil else {
                    skipping = nil
                    continue
                }
                lineNumber += 1
                guard line.count <= lineLimit else { return .overLimit(line: lineNumber) }
                if let job = try take(Array(line)) { return job }
                continue
            }
            scanned = buffer.count - head
            if let overLimit = try passLongLine() { return overLimit }
            if finished {
                guard head < buffer.count, skipping == nil else { return nil }
                let line = Array(buffer[head...])
                head = buffer.count
                scanned = 0
                lineNumber += 1
                return try take(line)
            }
            let chunk = try readChunk()
            if chunk.isEmpty { finished = true } else { append(chunk) }
        }
        return nil
    }

    /// A line without an end yet that passed the limit: refused now, then skipped as it arrives (nothing of it kept);
    /// one that never ends stops the reading.
    private mutating func passLongLine() throws -> Entry? {
        let pending = buffer.count - head
        if var skipped = skipping {
            skipped.bytes += pending
            skipping = skipped
            head = buffer.count
            scanned = 0
            guard skipped.bytes <= Self.maximumSkipped else {
                throw JobReaderError(
                    "line \(skipped.line) is over \(Self.maximumSkipped >> 20) MiB and still has no line "
                        + "end: the input is not one job per line (JSON Lines); stopped reading")
            }
            return nil
        }
        guard pending > lineLimit else { return nil }
        lineNumber += 1
        skipping = (lineNumber, pending)
        head = buffer.count
        scanned = 0
        return .overLimit(line: lineNumber)
    }

    /// Adds what was read, first dropping what was taken once it is half the buffer (not line by line).
    private mutating func append(_ chunk: [UInt8]) {
        if head == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            head = 0
        } else if head > buffer.count / 2 {
            buffer.removeFirst(head)
            head = 0
        }
        buffer.append(contentsOf: chunk)
    }

    /// What the input has now, up to 1 MiB: at least a byte, or none at its end. A pipe's jobs are taken as they
    /// come, not once a whole chunk has arrived (a producer may write one job a minute).
    private mutating func readChunk() throws -> [UInt8] {
        let descriptor = handle.fileDescriptor
        while true {
            let count = scratch.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count >= 0 {
                bytesRead += count
                return Array(scratch.prefix(count))
            }
            guard errno == EINTR else {
                throw JobReaderError("cannot read the input: \(String(cString: strerror(errno)))")
            }
        }
    }

    private mutating func take(_ line: [UInt8]) throws -> Entry? {
        let trimmed = line.drop { $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }
        guard !trimmed.isEmpty else { return nil }
        if mode == .undecided {
            if (try? JSONReader.parse(Array(line))) != nil || trimmed.first != UInt8(ascii: "{") {
                mode = .lines
            } else {
                // The first line opens an object it does not close: the whole input is one job.
                mode = .single
                var whole = line + [UInt8(ascii: "\n")] + buffer[head...]
                buffer.removeAll()
                head = 0
                while !finished {
                    let chunk = try readChunk()
                    if chunk.isEmpty { finished = true } else { whole.append(contentsOf: chunk) }
                    guard whole.count <= Self.maximumSingleJob else {
                        throw JobReaderError(
                            "line 1 starts a job that does not end on its line, and the input is "
                                + "over \(Self.maximumSingleJob) bytes: give one job per line (JSON Lines)")
                    }
                }
                return .job(line: lineNumber, body: whole)
            }
        }
        return .job(line: lineNumber, body: line)
    }
}

public struct JobReaderError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
