import APNs
import Foundation

/// Splits input into jobs without holding more than one chunk and one job in memory: JSON Lines (a job per line,
/// blank lines skipped), or, when the first line does not hold a whole JSON value, one pretty-printed job.
public struct JobReader {
    /// The largest input taken as a single multi-line job (the worker's message limit is far below).
    public static let maximumSingleJob = 4 << 20

    private let handle: FileHandle
    public let totalBytes: Int?
    public private(set) var bytesRead = 0
    private var buffer: [UInt8] = []
    /// Where each read lands.
    private var scratch = [UInt8](repeating: 0, count: 1 << 20)
    private var lineNumber = 0
    private var finished = false
    private var mode: Mode = .undecided

    private enum Mode { case undecided, lines, single }

    public init(path: String) throws {
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

    /// The next job and the line it starts on, or nil at the end of the input.
    public mutating func next() throws -> (line: Int, body: [UInt8])? {
        while true {
            if mode == .single {
                return nil
            }
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = Array(buffer[..<newline])
                buffer.removeSubrange(...newline)
                lineNumber += 1
                if let job = try take(line) { return job }
                continue
            }
            if finished {
                guard !buffer.isEmpty else { return nil }
                let line = buffer
                buffer.removeAll()
                lineNumber += 1
                return try take(line)
            }
            let chunk = try readChunk()
            if chunk.isEmpty { finished = true } else { buffer.append(contentsOf: chunk) }
        }
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

    private mutating func take(_ line: [UInt8]) throws -> (line: Int, body: [UInt8])? {
        let trimmed = line.drop { $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }
        guard !trimmed.isEmpty else { return nil }
        if mode == .undecided {
            if (try? JSONReader.parse(Array(line))) != nil || trimmed.first != UInt8(ascii: "{") {
                mode = .lines
            } else {
                // The first line opens an object it does not close: the whole input is one job.
                mode = .single
                var whole = line + [UInt8(ascii: "\n")] + buffer
                buffer.removeAll()
                while !finished {
                    let chunk = try readChunk()
                    if chunk.isEmpty { finished = true } else { whole.append(contentsOf: chunk) }
                    guard whole.count <= Self.maximumSingleJob else {
                        throw JobReaderError("line 1 starts a job that does not end on its line, and the input is "
                                             + "over \(Self.maximumSingleJob) bytes: give one job per line (JSON Lines)")
                    }
                }
                return (lineNumber, whole)
            }
        }
        return (lineNumber, line)
    }
}

public struct JobReaderError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
