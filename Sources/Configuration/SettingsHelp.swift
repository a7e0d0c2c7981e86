import Foundation

extension SettingTable {
    /// The settings `program` reads, in the table's order, for its `--help`.
    public static func help(for program: Programs) -> String {
        help(listing: entries.filter { $0.readers.contains(program) })
    }

    /// One entry a setting: its name, then its help line, the kind of value and its default, wrapped to the width
    /// of the other help texts.
    public static func help(listing settings: [any SettingEntry]) -> String {
        let column = 2 + (settings.map(\.name.count).max() ?? 0) + 2
        return settings.map { setting in
            let text = "\(setting.help) (\(setting.kindDescription); default \(setting.unsetMeans))"
            let lines = wrap(text, width: max(40, helpWidth - column))
            let indent = String(repeating: " ", count: column)
            let first = ("  " + setting.name).padding(toLength: column, withPad: " ", startingAt: 0) + lines[0]
            return ([first] + lines.dropFirst().map { indent + $0 }).joined(separator: "\n")
        }.joined(separator: "\n")
    }

    /// The widest line of the help texts.
    static let helpWidth = 118

    /// Words into lines of at most `width` characters (a longer word gets a line of its own).
    static func wrap(_ text: String, width: Int) -> [String] {
        var lines: [String] = []
        var line = ""
        for word in text.split(separator: " ") {
            if !line.isEmpty && line.count + 1 + word.count > width {
                lines.append(line)
                line = ""
            }
            line += (line.isEmpty ? "" : " ") + word
        }
        return lines + [line]
    }
}
