/// A small strict JSON reader (RFC 8259) that keeps each value's byte range, so a job's payload is forwarded
/// exactly as the sender wrote it (no re-encoding), and that bounds nesting depth against hostile input.
// Not `indirect`: arrays and objects already hold their children in array storage, so a scalar costs no box.
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    /// The number's text, as written.
    case number(String)
    case string(String)
    case array([JSONValue])
    case object([JSONMember])

    public var typeName: String {
        switch self {
        case .null: "null"
        case .bool: "a boolean"
        case .number: "a number"
        case .string: "a string"
        case .array: "an array"
        case .object: "an object"
        }
    }

    public subscript(key: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.key == key }?.value
    }

    public func member(_ key: String) -> JSONMember? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.key == key }
    }
}

public struct JSONMember: Sendable, Equatable {
    public var key: String
    public var value: JSONValue
    /// Where the value's text sits in the document.
    public var range: Range<Int>
}

public struct JSONError: Error, Sendable, Equatable, CustomStringConvertible {
    public var offset: Int
    public var message: String
    public var description: String { "\(message) at byte \(offset)" }
}

public struct JSONReader {
    public static let defaultMaximumDepth = 32

    /// Valid during one parse only (`parseMeasuringDepth` lends it).
    private let bytes: UnsafeBufferPointer<UInt8>
    private var position = 0
    private let maximumDepth: Int
    private let allowsDuplicateKeys: Bool
    /// The deepest nesting met so far.
    private var deepest = 0
    private var opaqueMembers: [String] = []
    /// The member names of the objects being read, innermost last: one array for every level, which reading
    /// allocates once (names of up to 15 bytes, most of them, are Strings that allocate nothing).
    private var memberNames: [String] = []

    /// Parses one JSON document. A member name repeated in one object is refused unless `allowsDuplicateKeys`:
    /// readers disagree about such a document (this one would take the first value; Python, JavaScript and Go take
    /// the last), so a job that means two things to its sender and to the worker is refused, naming the key.
    public static func parse(_ bytes: [UInt8], maximumDepth: Int = defaultMaximumDepth,
                             allowsDuplicateKeys: Bool = false) throws(JSONError) -> JSONValue {
        try parseMeasuringDepth(bytes, maximumDepth: maximumDepth, allowsDuplicateKeys: allowsDuplicateKeys).value
    }

    /// Parses, and tells how deep the document nests (an object or array at the top is depth 1).
    ///
    /// `opaqueMembers`: members of the top-level object whose value is only checked (as strictly as the rest:
    /// grammar, UTF-8, duplicate keys, depth), not built: an object or array among them reads as an empty one, and
    /// its member's `range` locates its text. For a value the caller forwards as written (a job's payload), which
    /// would otherwise cost a String per key and value and an array per object.
    public static func parseMeasuringDepth(_ bytes: [UInt8], maximumDepth: Int = defaultMaximumDepth,
                                           allowsDuplicateKeys: Bool = false,
                                           opaqueMembers: [String] = []) throws(JSONError) -> (value: JSONValue, depth: Int) {
        // The reader walks the bytes in place: an unsafe buffer, whose reads cost no bounds check in release builds,
        // is what keeps reading near a few instructions per byte.
        try bytes.withUnsafeBufferPointer { buffer throws(JSONError) in
            var reader = JSONReader(bytes: buffer, maximumDepth: maximumDepth, allowsDuplicateKeys: allowsDuplicateKeys)
            reader.opaqueMembers = opaqueMembers
            if buffer.starts(with: [0xEF, 0xBB, 0xBF]) {
                throw reader.error("starts with a UTF-8 byte-order mark (EF BB BF), which JSON must not (RFC 8259): "
                                   + "save it as UTF-8 without one")
            }
            reader.skipWhitespace()
            let value = try reader.parseValue(depth: 0)
            reader.skipWhitespace()
            guard reader.position == buffer.count else { throw reader.error("unexpected text after the JSON value") }
            return (value, reader.deepest)
        }
    }

    private init(bytes: UnsafeBufferPointer<UInt8>, maximumDepth: Int, allowsDuplicateKeys: Bool) {
        self.bytes = bytes
        self.maximumDepth = maximumDepth
        self.allowsDuplicateKeys = allowsDuplicateKeys
    }

    private func error(_ message: String) -> JSONError { JSONError(offset: position, message: message) }

    private mutating func skipWhitespace() {
        while position < bytes.count {
            switch bytes[position] {
            case 0x20, 0x09, 0x0A, 0x0D: position += 1
            default: return
            }
        }
    }

    private mutating func parseValue(depth: Int) throws(JSONError) -> JSONValue {
        guard position < bytes.count else { throw error("unexpected end of JSON") }
        switch bytes[position] {
        case UInt8(ascii: "{"): return try parseObject(depth: depth + 1)
        case UInt8(ascii: "["): return try parseArray(depth: depth + 1)
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"): try expectLiteral("true"); return .bool(true)
        case UInt8(ascii: "f"): try expectLiteral("false"); return .bool(false)
        case UInt8(ascii: "n"): try expectLiteral("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try parseNumber())
        default:
            let byte = bytes[position]
            // A byte of a multi-byte character would print as the wrong character: name it by its value.
            throw error(byte < 0x80 ? "unexpected character '\(Character(Unicode.Scalar(byte)))'"
                                    : "unexpected byte 0x\(String(byte, radix: 16, uppercase: true))")
        }
    }

    private mutating func expectLiteral(_ literal: StaticString) throws(JSONError) {
        let count = literal.utf8CodeUnitCount
        guard position + count <= bytes.count else { throw error("invalid literal") }
        for offset in 0..<count where bytes[position + offset] != literal.utf8Start[offset] {
            throw error("invalid literal")
        }
        position += count
    }

    private mutating func parseObject(depth: Int) throws(JSONError) -> JSONValue {
        var members: [JSONMember] = []
        guard try opens(depth: depth, closing: UInt8(ascii: "}")) else { return .object(members) }
        var names = MemberNames(from: memberNames.count)
        defer { memberNames.removeSubrange(names.first...) }
        while true {
            let key = try memberName(into: &names)
            skipWhitespace()
            guard position < bytes.count, bytes[position] == UInt8(ascii: ":") else { throw error("expected ':'") }
            position += 1
            skipWhitespace()
            let start = position
            let value: JSONValue
            if depth == 1 && !opaqueMembers.isEmpty && opaqueMembers.contains(key) {
                value = try skipValue(depth: depth)
            } else {
                value = try parseValue(depth: depth)
            }
            members.append(JSONMember(key: key, value: value, range: start..<position))
            guard try continues(closing: UInt8(ascii: "}"), in: "an object") else { return .object(members) }
        }
    }

    /// The names of one object so far: those in `memberNames` from `first` on, then, past 16 of them, a set, so
    /// that a hostile object of many members costs linear time.
    private struct MemberNames {
        let first: Int
        var set: Set<String>?

        init(from first: Int) { self.first = first }
    }

    /// Reads a member name, refusing one the object already has unless duplicates are allowed: readers disagree
    /// about such a document (this one would take the first value; Python, JavaScript and Go take the last).
    private mutating func memberName(into names: inout MemberNames) throws(JSONError) -> String {
        skipWhitespace()
        guard position < bytes.count, bytes[position] == UInt8(ascii: "\"") else { throw error("expected a member name") }
        let start = position
        let name = try parseString()
        guard !allowsDuplicateKeys else { return name }
        if memberNames.capacity == 0 { memberNames.reserveCapacity(32) }
        if names.set == nil && memberNames.count - names.first >= 16 { names.set = Set(memberNames[names.first...]) }
        let repeated: Bool
        if names.set != nil {
            repeated = !names.set!.insert(name).inserted
        } else {
            repeated = memberNames[names.first...].contains(name)
            memberNames.append(name)
        }
        if repeated {
            position = start
            throw error("duplicate key \"\(name.prefix(64))\"")
        }
        return name
    }

    /// Enters an object or array at `depth` (its opening bracket is at `position`): false if it is empty (and then
    /// read to its end).
    private mutating func opens(depth: Int, closing: UInt8) throws(JSONError) -> Bool {
        guard depth <= maximumDepth else { throw error("nesting deeper than \(maximumDepth) levels") }
        deepest = max(deepest, depth)
        position += 1
        skipWhitespace()
        if position < bytes.count, bytes[position] == closing {
            position += 1
            return false
        }
        return true
    }

    /// After a member or element: true if another follows (its comma read), false at the end (its bracket read).
    private mutating func continues(closing: UInt8, in container: StaticString) throws(JSONError) -> Bool {
        skipWhitespace()
        guard position < bytes.count else { throw error("unexpected end of JSON in \(container)") }
        if bytes[position] == UInt8(ascii: ",") {
            position += 1
            return true
        }
        if bytes[position] == closing {
            position += 1
            return false
        }
        throw error("expected ',' or '\(Character(Unicode.Scalar(closing)))'")
    }

    private mutating func parseArray(depth: Int) throws(JSONError) -> JSONValue {
        var elements: [JSONValue] = []
        guard try opens(depth: depth, closing: UInt8(ascii: "]")) else { return .array(elements) }
        while true {
            skipWhitespace()
            elements.append(try parseValue(depth: depth))
            guard try continues(closing: UInt8(ascii: "]"), in: "an array") else { return .array(elements) }
        }
    }

    private mutating func parseNumber() throws(JSONError) -> String {
        let start = position
        try scanNumber()
        return String(decoding: bytes[start..<position], as: UTF8.self)
    }

    private mutating func scanNumber() throws(JSONError) {
        if bytes[position] == UInt8(ascii: "-") { position += 1 }
        func digits() -> Int {
            let begin = position
            while position < bytes.count, bytes[position] >= 48, bytes[position] <= 57 { position += 1 }
            return position - begin
        }
        let integerStart = position
        let integerDigits = digits()
        guard integerDigits > 0 else { throw error("invalid number") }
        if integerDigits > 1 && bytes[integerStart] == UInt8(ascii: "0") { throw error("leading zero in a number") }
        if position < bytes.count, bytes[position] == UInt8(ascii: ".") {
            position += 1
            guard digits() > 0 else { throw error("invalid number fraction") }
        }
        if position < bytes.count, bytes[position] == UInt8(ascii: "e") || bytes[position] == UInt8(ascii: "E") {
            position += 1
            if position < bytes.count, bytes[position] == UInt8(ascii: "+") || bytes[position] == UInt8(ascii: "-") {
                position += 1
            }
            guard digits() > 0 else { throw error("invalid number exponent") }
        }
    }

    // MARK: checking without building

    /// Checks a value exactly as `parseValue` would read it; an object or array comes back empty, a scalar as read.
    private mutating func skipValue(depth: Int) throws(JSONError) -> JSONValue {
        guard position < bytes.count else { throw error("unexpected end of JSON") }
        switch bytes[position] {
        case UInt8(ascii: "{"):
            try skipObject(depth: depth + 1)
            return .object([])
        case UInt8(ascii: "["):
            try skipArray(depth: depth + 1)
            return .array([])
        default:
            return try parseValue(depth: depth)
        }
    }

    /// A value inside a skipped one: nothing built, not even a scalar.
    private mutating func skipNested(depth: Int) throws(JSONError) {
        guard position < bytes.count else { throw error("unexpected end of JSON") }
        switch bytes[position] {
        case UInt8(ascii: "{"): try skipObject(depth: depth + 1)
        case UInt8(ascii: "["): try skipArray(depth: depth + 1)
        case UInt8(ascii: "\""): try skipString()
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): try scanNumber()
        default: _ = try parseValue(depth: depth)
        }
    }

    /// Checks a string as `parseString` would.
    private mutating func skipString() throws(JSONError) {
        let start = position
        position += 1
        var ascii = true
        while position < bytes.count {
            let byte = bytes[position]
            if byte == UInt8(ascii: "\"") {
                if !ascii && String(validating: bytes[(start + 1)..<position], as: UTF8.self) == nil {
                    position = start + 1
                    throw error("string is not UTF-8")
                }
                position += 1
                return
            }
            if byte == UInt8(ascii: "\\") || byte < 0x20 {
                // Escapes are rare: the full reader checks them.
                position = start
                _ = try parseString()
                return
            }
            if byte >= 0x80 { ascii = false }
            position += 1
        }
        throw error("unterminated string")
    }

    private mutating func skipObject(depth: Int) throws(JSONError) {
        guard try opens(depth: depth, closing: UInt8(ascii: "}")) else { return }
        var names = MemberNames(from: memberNames.count)
        defer { memberNames.removeSubrange(names.first...) }
        while true {
            _ = try memberName(into: &names)
            skipWhitespace()
            guard position < bytes.count, bytes[position] == UInt8(ascii: ":") else { throw error("expected ':'") }
            position += 1
            skipWhitespace()
            try skipNested(depth: depth)
            guard try continues(closing: UInt8(ascii: "}"), in: "an object") else { return }
        }
    }

    private mutating func skipArray(depth: Int) throws(JSONError) {
        guard try opens(depth: depth, closing: UInt8(ascii: "]")) else { return }
        while true {
            skipWhitespace()
            try skipNested(depth: depth)
            guard try continues(closing: UInt8(ascii: "]"), in: "an array") else { return }
        }
    }

    private mutating func parseString() throws(JSONError) -> String {
        position += 1
        // Most strings (user ids, tokens, topics) have no escape: one scan, then one String from the bytes.
        let start = position
        let fast: String?? = { (raw: UnsafeBufferPointer<UInt8>) in
            var scan = start
            var ascii = true
            while scan < raw.count {
                let byte = raw[scan]
                if byte == UInt8(ascii: "\"") {
                    let text = UnsafeBufferPointer(rebasing: raw[start..<scan])
                    // ASCII needs no validation, and String(decoding:) takes it in one copy.
                    return ascii ? String(decoding: text, as: UTF8.self) : String(validating: text, as: UTF8.self)
                }
                if byte == UInt8(ascii: "\\") || byte < 0x20 { return nil }
                if byte >= 0x80 { ascii = false }
                scan += 1
            }
            return nil
        }(bytes)
        switch fast {
        case .some(.some(let text)):
            position += text.utf8.count + 1
            return text
        case .some(.none): throw error("string is not UTF-8")
        case .none: break
        }
        var output: [UInt8] = []
        while true {
            guard position < bytes.count else { throw error("unterminated string") }
            let byte = bytes[position]
            position += 1
            switch byte {
            case UInt8(ascii: "\""):
                guard let text = String(validating: output, as: UTF8.self) else { throw error("string is not UTF-8") }
                return text
            case UInt8(ascii: "\\"):
                guard position < bytes.count else { throw error("unterminated escape") }
                let escape = bytes[position]
                position += 1
                switch escape {
                case UInt8(ascii: "\""): output.append(0x22)
                case UInt8(ascii: "\\"): output.append(0x5C)
                case UInt8(ascii: "/"): output.append(0x2F)
                case UInt8(ascii: "b"): output.append(0x08)
                case UInt8(ascii: "f"): output.append(0x0C)
                case UInt8(ascii: "n"): output.append(0x0A)
                case UInt8(ascii: "r"): output.append(0x0D)
                case UInt8(ascii: "t"): output.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try parseHex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard position + 1 < bytes.count, bytes[position] == UInt8(ascii: "\\"),
                              bytes[position + 1] == UInt8(ascii: "u") else { throw error("lone surrogate in \\u escape") }
                        position += 2
                        let low = try parseHex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw error("bad surrogate pair") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw error("lone surrogate in \\u escape")
                    }
                    guard let unicode = Unicode.Scalar(scalar) else { throw error("invalid \\u escape") }
                    output.append(contentsOf: Array(String(Character(unicode)).utf8))
                default:
                    throw error("invalid escape")
                }
            case 0..<0x20:
                throw error("control character in a string")
            default:
                output.append(byte)
            }
        }
    }

    private mutating func parseHex4() throws(JSONError) -> UInt32 {
        guard position + 4 <= bytes.count,
              let value = UInt32(String(decoding: bytes[position..<position + 4], as: UTF8.self), radix: 16) else {
            throw error("invalid \\u escape")
        }
        position += 4
        return value
    }
}
