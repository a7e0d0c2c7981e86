import Foundation

/// Where settings come from, weakest first: a `--config` file of KEY=VALUE lines, the environment, command-line
/// flags. The result is one dictionary for `WorkerConfiguration.load`.
public enum ConfigurationSources {
    /// Reads KEY=VALUE lines: `#` comments and blank lines are skipped, an `export ` prefix and one pair of quotes
    /// around the value are allowed (so a file can also be sourced by a shell). Lines may end in LF or CR LF.
    public static func parseFile(_ text: String, name: String) throws(ConfigurationError) -> [String: String] {
        var values: [String: String] = [:]
        // A file saved on Windows ends its lines with CR LF, which Swift reads as one character, not as "\n": split
        // on either, or a CRLF file would be one long line (and a first comment line would hide every setting).
        let lines = text.split(omittingEmptySubsequences: false) { $0 == "\n" || $0 == "\r\n" || $0 == "\r" }
        for (number, rawLine) in lines.enumerated() {
            var line = rawLine.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") { continue }
            if line.hasPrefix("export ") { line = String(line.dropFirst(7)).trimmingCharacters(in: .whitespaces) }
            guard let equals = line.firstIndex(of: "="),
                case let key = line[..<equals].trimmingCharacters(in: .whitespaces),
                !key.isEmpty, key.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" })
            else {
                throw ConfigurationError(key: "--config", "\(name) line \(number + 1): expected KEY=VALUE")
            }
            let afterEquals = line[line.index(after: equals)...]
            let value = afterEquals.trimmingCharacters(in: .whitespaces)
            // `KEY= # note`: an empty value and a comment to a shell, "# note" to systemd.
            let commentOnly = value.hasPrefix("#") && afterEquals.first?.isWhitespace == true
            guard !commentOnly, let read = Self.value(value) else {
                // The line is not shown: its value may be a password.
                throw ConfigurationError(
                    key: "--config",
                    "\(name) line \(number + 1) (\(key)): text after the value (a comment?) or after its closing quote "
                        + "is read one way by systemd and another by a shell: put a comment on a line of its own")
            }
            values[key] = read
        }
        return values
    }

    /// A value as a shell and systemd's EnvironmentFile both read it: without one pair of quotes around it, if it
    /// has them; nil if the two would read it differently: ` #` and what follows outside quotes (a shell's comment,
    /// part of the value for systemd), or text after the closing quote.
    private static func value(_ text: String) -> String? {
        if let first = text.first, first == "\"" || first == "'" {
            guard text.count >= 2, let close = text.dropFirst().firstIndex(of: first) else { return text }
            guard text.index(after: close) == text.endIndex else { return nil }
            return String(text[text.index(after: text.startIndex)..<close])
        }
        let comment = text.indices.contains { index in
            text[index] == "#" && index > text.startIndex && text[text.index(before: index)].isWhitespace
        }
        return comment ? nil : text
    }

    /// File, then environment, then flags: each later source wins.
    public static func merge(
        file: [String: String], environment: [String: String],
        flags: [String: String]
    ) -> [String: String] {
        file.merging(environment) { _, new in new }.merging(flags) { _, new in new }
    }

    public static func readFile(_ path: String) throws(ConfigurationError) -> [String: String] {
        let text: String
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw ConfigurationError(key: "--config", "\(path) is a directory, not a file")
        }
        do { text = try String(contentsOfFile: path, encoding: .utf8) } catch {
            throw ConfigurationError(key: "--config", "cannot read \(path) (missing, unreadable or not UTF-8)")
        }
        return try parseFile(text, name: path)
    }
}
