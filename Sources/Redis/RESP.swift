/// Commands in Redis's protocol (RESP 2): an array of bulk strings, `*<count>\r\n` then `$<length>\r\n<bytes>\r\n` per
/// argument. Written here in one pass over the arguments' UTF-8, rather than by hiredis's printf-style formatting,
/// which cost a few hundred instructions per argument (a pipeline of a thousand token lookups has two thousand).
enum RESP {
    /// At least the bytes `append` writes for `arguments` (its numbers counted at their widest).
    static func maximumSize(of arguments: [String]) -> Int {
        arguments.reduce(1 + 20 + 2) { $0 + 1 + 20 + 2 + $1.utf8.count + 2 }
    }

    static func append(_ arguments: [String], to command: inout [UInt8]) {
        command.append(UInt8(ascii: "*"))
        appendDecimal(arguments.count, to: &command)
        command.append(contentsOf: [13, 10])
        for argument in arguments {
            var argument = argument
            argument.withUTF8 { bytes in
                command.append(UInt8(ascii: "$"))
                appendDecimal(bytes.count, to: &command)
                command.append(contentsOf: [13, 10])
                command.append(contentsOf: bytes)
                command.append(contentsOf: [13, 10])
            }
        }
    }

    private static func appendDecimal(_ value: Int, to command: inout [UInt8]) {
        guard value >= 10 else { return command.append(UInt8(ascii: "0") + UInt8(value)) }
        appendDecimal(value / 10, to: &command)
        command.append(UInt8(ascii: "0") + UInt8(value % 10))
    }
}
