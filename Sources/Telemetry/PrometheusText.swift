/// The Prometheus text exposition format (0.0.4), built family by family: HELP and TYPE lines, then the samples
/// with their labels escaped as the format wants (backslash, double quote, newline).
public struct PrometheusText {
    public typealias Labels = [(name: String, value: String)]

    public private(set) var text = ""

    public init() {}

    /// One family: `type` is counter or gauge; each sample its labels (none: `[]`) and value.
    public mutating func family(
        _ name: String, _ type: String, _ help: String, _ samples: [(labels: Labels, value: Int)]
    ) {
        header(name, type, help)
        for sample in samples { text += name + Self.render(sample.labels) + " \(sample.value)\n" }
    }

    public mutating func counter(_ name: String, _ help: String, _ value: Int) {
        family(name, "counter", help, [([], value)])
    }
    public mutating func gauge(_ name: String, _ help: String, _ value: Int) {
        family(name, "gauge", help, [([], value)])
    }

    public mutating func histogram(_ name: String, _ help: String, _ histogram: Histogram) {
        histograms(name, help, [([], histogram)])
    }

    /// One histogram per label set.
    public mutating func histograms(_ name: String, _ help: String, _ series: [(labels: Labels, histogram: Histogram)])
    {
        header(name, "histogram", help)
        for (labels, histogram) in series {
            buckets(name, labels, histogram.boundLabels, histogram.cumulativeCounts, histogram.totalSeconds)
        }
    }

    /// One histogram that is the sum of `parts` (same bounds): a total beside its parts, without observing each
    /// value twice.
    public mutating func histogram(_ name: String, _ help: String, summing parts: [Histogram]) {
        header(name, "histogram", help)
        guard let bounds = parts.first?.bounds else { return }
        var cumulative = [Int](repeating: 0, count: bounds.count + 1)
        for part in parts {
            precondition(part.bounds == bounds, "histograms summed share their bounds")
            for (bucket, count) in part.cumulativeCounts.enumerated() { cumulative[bucket] += count }
        }
        buckets(name, [], parts[0].boundLabels, cumulative, parts.reduce(0) { $0 + $1.totalSeconds })
    }

    /// The series' labels are rendered once and each bucket's `le` appended to them, its bound written once per
    /// histogram (`Histogram.boundLabels`): a scrape then formats no number but the counts and the sum.
    private mutating func buckets(
        _ name: String, _ labels: Labels, _ boundLabels: [String], _ cumulative: [Int],
        _ totalSeconds: Double
    ) {
        let rendered = Self.render(labels)
        let bucketPrefix = name + "_bucket" + (labels.isEmpty ? "{" : rendered.dropLast() + ",") + "le=\""
        for (bound, count) in zip(boundLabels + ["+Inf"], cumulative) {
            text += bucketPrefix + bound + "\"} " + String(count) + "\n"
        }
        text += name + "_sum" + rendered + " \(totalSeconds)\n"
        text += name + "_count" + rendered + " " + String(cumulative.last ?? 0) + "\n"
    }

    private mutating func header(_ name: String, _ type: String, _ help: String) {
        text += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
    }

    static func render(_ labels: Labels) -> String {
        guard !labels.isEmpty else { return "" }
        return "{"
            + labels.map { label in
                // Most values need no escape: checked over their bytes, not character by character.
                guard
                    label.value.utf8.contains(where: {
                        $0 == UInt8(ascii: "\\") || $0 == UInt8(ascii: "\"") || $0 == 0x0A
                    })
                else {
                    return label.name + "=\"" + label.value + "\""
                }
                var escaped = ""
                for character in label.value {
                    switch character {
                    case "\\": escaped += "\\\\"
                    case "\"": escaped += "\\\""
                    case "\n": escaped += "\\n"
                    default: escaped.append(character)
                    }
                }
                return "\(label.name)=\"\(escaped)\""
            }.joined(separator: ",") + "}"
    }
}
