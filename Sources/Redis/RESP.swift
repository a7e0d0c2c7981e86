#if canImport(Glibc)
    import Glibc
#endif

/// Commands in Redis's protocol (RESP 2): an array of bulk strings, `*<count>\r\n` then `$<length>\r\n<bytes>\r\n` per
/// argument, written in one pass over the arguments' UTF-8.
enum RESP {
    /// At least the bytes `format` writes for a command of `arguments` (its numbers counted at their widest).
    static func maximumSize(of arguments: [String]) -> Int {
        arguments.reduce(1 + 20 + 2) { $0 + 1 + 20 + 2 + $1.utf8.count + 2 }
    }

    /// `commands` one after another, in one buffer, written through a pointer into room reserved once: appended to
    /// an array byte by byte, with its uniqueness and capacity checked at each step, they cost about 550
    /// instructions per argument in the callgrind profile (a settled job's id, a fan-out job's user).
    static func format(_ commands: [[String]]) -> [UInt8] {
        let capacity = commands.reduce(0) { $0 + maximumSize(of: $1) }
        guard capacity > 0 else { return [] }
        return [UInt8](unsafeUninitializedCapacity: capacity) { buffer, count in
            var writer = Writer(base: buffer.baseAddress!)
            for arguments in commands {
                writer.put(UInt8(ascii: "*"))
                writer.putDecimal(arguments.count)
                writer.putLineEnd()
                for argument in arguments {
                    var argument = argument
                    argument.withUTF8 { bytes in
                        writer.put(UInt8(ascii: "$"))
                        writer.putDecimal(bytes.count)
                        writer.putLineEnd()
                        writer.put(bytes)
                        writer.putLineEnd()
                    }
                }
            }
            count = writer.offset
        }
    }
}

extension RESP {
    /// `HGETALL <prefix><name>` for each of `keys`: the keys are written from their prefix and names, never built as
    /// strings of their own.
    static func hashReads(_ keys: RedisKeyList) -> [UInt8] {
        guard !keys.names.isEmpty else { return [] }
        var prefix = keys.prefix
        return prefix.withUTF8 { prefix in
            var command = "*2\r\n$7\r\nHGETALL\r\n"
            return command.withUTF8 { command in hashReads(keys.names, command: command, prefix: prefix) }
        }
    }

    private static func hashReads(
        _ names: [String], command: UnsafeBufferPointer<UInt8>,
        prefix: UnsafeBufferPointer<UInt8>
    ) -> [UInt8] {
        let capacity = names.reduce(0) { $0 + command.count + 1 + 20 + 2 + prefix.count + $1.utf8.count + 2 }
        return [UInt8](unsafeUninitializedCapacity: capacity) { buffer, count in
            var writer = Writer(base: buffer.baseAddress!)
            for var name in names {
                writer.put(command)
                name.withUTF8 { name in
                    writer.put(UInt8(ascii: "$"))
                    writer.putDecimal(prefix.count + name.count)
                    writer.putLineEnd()
                    writer.put(prefix)
                    writer.put(name)
                    writer.putLineEnd()
                }
            }
            count = writer.offset
        }
    }
}

/// Keys made of one prefix and a name each (`apns:tokens:` and users), for reading many hashes at once.
public struct RedisKeyList: Sendable {
    public var prefix: String
    public var names: [String]

    public init(prefix: String, names: [String]) {
        self.prefix = prefix
        self.names = names
    }

    public var count: Int { names.count }

    public func key(_ index: Int) -> String { prefix + names[index] }
}

/// Writes forward from `base`, into room its caller made.
private struct Writer {
    let base: UnsafeMutablePointer<UInt8>
    var offset = 0

    mutating func put(_ byte: UInt8) {
        base[offset] = byte
        offset += 1
    }

    mutating func putLineEnd() {
        base[offset] = 13
        base[offset + 1] = 10
        offset += 2
    }

    mutating func put(_ bytes: UnsafeBufferPointer<UInt8>) {
        if let start = bytes.baseAddress, !bytes.isEmpty { memcpy(base + offset, start, bytes.count) }
        offset += bytes.count
    }

    /// `value` (not negative) in decimal, every digit.
    mutating func putDecimal(_ value: Int) {
        var digits = 1
        var rest = value / 10
        while rest > 0 {
            digits += 1
            rest /= 10
        }
        var remaining = value
        var at = offset + digits
        repeat {
            at -= 1
            base[at] = UInt8(ascii: "0") + UInt8(remaining % 10)
            remaining /= 10
        } while remaining > 0
        offset += digits
    }
}
