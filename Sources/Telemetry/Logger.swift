import Foundation
import JSON

#if canImport(Glibc)
    import Glibc
#endif

/// A structured logger in the shape of swift-log: a value type with a label, a level and metadata with dotted keys.
/// Each record is one line written with a single `write(2)`, so lines from different threads never interleave.
public struct Logger: Sendable {
    public enum Level: Int, Sendable, Comparable, CaseIterable {
        case trace, debug, info, notice, warning, error, critical

        public var name: String {
            switch self {
            case .trace: "trace"
            case .debug: "debug"
            case .info: "info"
            case .notice: "notice"
            case .warning: "warning"
            case .error: "error"
            case .critical: "critical"
            }
        }

        public init?(name: String) {
            guard let level = Level.allCases.first(where: { $0.name == name.lowercased() }) else { return nil }
            self = level
        }

        @inlinable public static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }
    }

    public enum Format: String, Sendable {
        /// One JSON object per line: what log shippers expect.
        case json
        /// `time level label message key=value ...`: for a person at a terminal.
        case text
    }

    public typealias Metadata = [String: String]

    public let label: String
    public var level: Level
    public var format: Format
    public var metadata: Metadata
    private let fileDescriptor: Int32

    public init(
        label: String, level: Level = .info, format: Format = .json, metadata: Metadata = [:],
        fileDescriptor: Int32 = 2
    ) {
        self.label = label
        self.level = level
        self.format = format
        self.metadata = metadata
        self.fileDescriptor = fileDescriptor
    }

    /// The same logger under another label, e.g. one per component.
    public func child(_ label: String, metadata extra: Metadata = [:]) -> Logger {
        var copy = Logger(
            label: label, level: level, format: format, metadata: metadata,
            fileDescriptor: fileDescriptor)
        copy.metadata.merge(extra) { _, new in new }
        return copy
    }

    @inlinable public func isEnabled(_ level: Level) -> Bool { level >= self.level }

    /// The level methods check the level where they are called (inlined), so that a record below the level costs the
    /// caller no call and no copy of the logger: a debug record per settled job had cost a few hundred instructions,
    /// logged or not.
    public func log(_ level: Level, _ message: @autoclosure () -> String, _ extra: @autoclosure () -> Metadata = [:]) {
        guard isEnabled(level) else { return }
        var fields = metadata
        fields.merge(extra()) { _, new in new }
        let line = render(level: level, message: message(), fields: fields)
        line.utf8CString.withUnsafeBufferPointer { buffer in
            _ = buffer.baseAddress.map { write(fileDescriptor, $0, buffer.count - 1) }
        }
    }

    @inlinable
    public func trace(_ message: @autoclosure () -> String, _ extra: @autoclosure () -> Metadata = [:]) {
        if isEnabled(.trace) { log(.trace, message(), extra()) }
    }
    @inlinable
    public func debug(_ message: @autoclosure () -> String, _ extra: @autoclosure () -> Metadata = [:]) {
        if isEnabled(.debug) { log(.debug, message(), extra()) }
    }
    @inlinable
    public func info(_ message: @autoclosure () -> String, _ extra: @autoclosure () -> Metadata = [:]) {
        if isEnabled(.info) { log(.info, message(), extra()) }
    }
    @inlinable
    public func notice(_ message: @autoclosure () -> String, _ extra: @autoclosure () -> Metadata = [:]) {
        if isEnabled(.notice) { log(.notice, message(), extra()) }
    }
    @inlinable
    public func warning(_ message: @autoclosure () -> String, _ extra: @autoclosure () -> Metadata = [:]) {
        if isEnabled(.warning) { log(.warning, message(), extra()) }
    }
    @inlinable
    public func error(_ message: @autoclosure () -> String, _ extra: @autoclosure () -> Metadata = [:]) {
        if isEnabled(.error) { log(.error, message(), extra()) }
    }
    @inlinable
    public func critical(_ message: @autoclosure () -> String, _ extra: @autoclosure () -> Metadata = [:]) {
        if isEnabled(.critical) { log(.critical, message(), extra()) }
    }

    private func render(level: Level, message: String, fields: Metadata) -> String {
        let time = Self.timestamp()
        switch format {
        case .json:
            var line = "{\"ts\":\"\(time)\",\"level\":\"\(level.name)\",\"label\":\(JSONString.quote(label)),"
            line += "\"msg\":\(JSONString.quote(message))"
            for key in fields.keys.sorted() {
                line += ",\(JSONString.quote(key)):\(JSONString.quote(fields[key]!))"
            }
            return line + "}\n"
        case .text:
            var line = "\(time) \(level.name.uppercased()) \(label): \(Self.oneLine(message))"
            for key in fields.keys.sorted() { line += " \(key)=\(Self.textValue(fields[key]!))" }
            return line + "\n"
        }
    }

    /// A value as logfmt writes one: bare when it holds no space, quote, equals sign, backslash or control
    /// character, quoted with those escaped otherwise, so that a line break in a job's id cannot begin a line of its
    /// own and every value ends where a reader expects.
    static func textValue(_ value: String) -> String {
        let bare =
            !value.isEmpty
            && value.unicodeScalars.allSatisfy {
                $0.value > 0x20 && $0.value != 0x7F && $0 != "\"" && $0 != "=" && $0 != "\\"
            }
        return bare ? value : JSONString.quote(value)
    }

    /// A message on one line: its control characters escaped as in JSON.
    static func oneLine(_ message: String) -> String {
        guard message.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else { return message }
        return String(JSONString.quote(message).dropFirst().dropLast())
    }

    private static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        let millis = now.tv_nsec / 1_000_000
        func pad(_ value: Int32, _ width: Int) -> String {
            let digits = String(value)
            return String(repeating: "0", count: max(0, width - digits.count)) + digits
        }
        return "\(parts.tm_year + 1900)-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(Int32(millis), 3))Z"
    }
}

/// Device tokens identify a person's device: logs carry only enough of one to correlate, never all of it.
public enum Redact {
    public static func token(_ token: String) -> String {
        let prefix = token.prefix(8)
        return "\(prefix)…(\(token.count))"
    }

    /// Text from outside shown whole (a job's id, a proxy's status line), made safe for a terminal: each control
    /// character (an escape sequence's start) as "?".
    public static func printable(_ text: some StringProtocol) -> String {
        String(text.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? "?" : Character($0) })
    }

    /// Text that came from outside (a server's reason or GOAWAY data), made fit for a log line: control characters
    /// dropped, any run of 16 or more hex digits (a device token an endpoint echoed back) shortened like a token,
    /// and at most `limit` characters.
    public static func outsideText(_ text: String, limit: Int = 80) -> String {
        var out = ""
        var run = ""
        func flush() {
            out += run.count >= 16 ? token(run) : run
            run = ""
        }
        for character in text.prefix(limit * 4) {
            if character.isHexDigit && character.isASCII {
                run.append(character)
                continue
            }
            flush()
            if character.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F }) { out.append(character) }
        }
        flush()
        return out.count > limit ? String(out.prefix(limit)) + "…" : out
    }
}
