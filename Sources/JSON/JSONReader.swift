/// A small strict JSON reader (RFC 8259) that keeps each value's byte range, so a job's payload is forwarded
/// exactly as the sender wrote it (no re-encoding), and that bounds nesting depth against hostile input.
///
/// Not copyable: a reader holds memory lent for one parse, which a copy could free under it or leak.
public struct JSONReader: ~Copyable {
    public static let defaultMaximumDepth = 32

    /// Valid during one parse only (`parseMeasuringDepth` and `readObject` lend it).
    private let bytes: UnsafeBufferPointer<UInt8>
    private var position = 0
    private let maximumDepth: Int
    private let allowsDuplicateKeys: Bool
    /// The deepest nesting met so far.
    private var deepest = 0
    /// The member names of the objects being read, innermost last, as where their UTF-8 bytes are (`bytes(ofName:)`):
    /// in the document itself for a name without escapes (most names: nothing copied), otherwise, escapes resolved,
    /// in `nameBytes` (one buffer for every level, lent on the stack and moved to the heap only if outgrown). A
    /// repeated name is found by comparing bytes, with no String made for a name only checked.
    private var nameBytes: Scratch<UInt8>
    private var names: Scratch<Range<Int>>
    /// During `readObject`: the depth of the top-level object's member values.
    private var memberDepth = 1

    /// Where the reader is in the document: during `readObject`, a member's value starts here before it is read
    /// and ends here after.
    public var offset: Int { position }

    /// Parses one JSON document. A member name repeated in one object is refused unless `allowsDuplicateKeys`:
    /// readers disagree about such a document (this one would take the first value; Python, JavaScript and Go take
    /// the last), so a job that means two things to its sender and to the worker is refused, naming the key.
    public static func parse(
        _ bytes: [UInt8], maximumDepth: Int = defaultMaximumDepth,
        allowsDuplicateKeys: Bool = false
    ) throws(JSONError) -> JSONValue {
        try parseMeasuringDepth(bytes, maximumDepth: maximumDepth, allowsDuplicateKeys: allowsDuplicateKeys).value
    }

    /// Parses, and tells how deep the document nests (an object or array at the top is depth 1).
    public static func parseMeasuringDepth(
        _ bytes: [UInt8], maximumDepth: Int = defaultMaximumDepth,
        allowsDuplicateKeys: Bool = false
    ) throws(JSONError) -> (value: JSONValue, depth: Int) {
        try reading(bytes, maximumDepth: maximumDepth, allowsDuplicateKeys: allowsDuplicateKeys) {
            reader throws(JSONError) in
            (try reader.parseValue(depth: 0), reader.deepest)
        }
    }

    /// Reads a document whose top level is an object one member at a time, building nothing the caller does not
    /// ask for: `member` is called with the index of the member's name in `known` (nil for a name not there) and
    /// reads the value with one of `readValue`, `checkValue` or `readStrings`; a value it leaves alone is checked
    /// and skipped. Everything is checked as strictly as `parse` does (grammar, UTF-8, duplicate keys at every
    /// level unless allowed, depth), and a document that is not an object is read whole. For a job, whose few known
    /// members go straight into typed fields and whose payload is forwarded as written.
    public static func readObject(
        _ bytes: [UInt8], maximumDepth: Int = defaultMaximumDepth, allowsDuplicateKeys: Bool = false,
        known: JSONNames, member: (inout JSONReader, Int?) throws(JSONError) -> Void
    ) throws(JSONError) -> JSONTopLevel {
        try reading(bytes, maximumDepth: maximumDepth, allowsDuplicateKeys: allowsDuplicateKeys) {
            reader throws(JSONError) in
            guard reader.position < reader.bytes.count, reader.bytes[reader.position] == UInt8(ascii: "{") else {
                return .other(typeName: try reader.parseValue(depth: 0).typeName)
            }
            try reader.readMembers(known: known, member: member)
            return .object(depth: reader.deepest)
        }
    }

    /// Checks a document as `parse` would read it, building nothing for an object at the top (a server that only
    /// needs to know that a body is a valid JSON object).
    public static func check(_ bytes: [UInt8], allowsDuplicateKeys: Bool = false) throws(JSONError) -> JSONTopLevel {
        try readObject(bytes, allowsDuplicateKeys: allowsDuplicateKeys, known: noNames) { _, _ throws(JSONError) in }
    }
    private static let noNames = JSONNames([])

    /// Checks the object that starts at `offset` in `bytes` as `readObject` checks a member's value at `depth` (the
    /// object itself at `depth`), as strictly, and returns where it ends. For a reader of its own that meets an object
    /// it only needs checked (a job's payload, read by `PushJob` in one pass).
    public static func checkObject(
        in bytes: UnsafeBufferPointer<UInt8>, at offset: Int, depth: Int, maximumDepth: Int
    ) throws(JSONError) -> Int {
        if let end = JSONQuickCheck.objectEnd(in: bytes, at: offset, depth: depth, maximumDepth: maximumDepth) {
            return end
        }
        return try checkObjectReading(in: bytes, at: offset, depth: depth, maximumDepth: maximumDepth)
    }

    /// `checkObject` by the reader's general steps: for what `JSONQuickCheck` leaves, and what it is held to.
    static func checkObjectReading(
        in bytes: UnsafeBufferPointer<UInt8>, at offset: Int, depth: Int, maximumDepth: Int
    ) throws(JSONError) -> Int {
        try lending(bytes, maximumDepth: maximumDepth, allowsDuplicateKeys: false) { reader throws(JSONError) in
            guard (0..<bytes.count).contains(offset), bytes[offset] == UInt8(ascii: "{") else {
                throw reader.error("expected an object")
            }
            reader.position = offset
            try reader.skipObject(depth: depth)
            return reader.position
        }
    }

    /// Lends a reader over `bytes` to `read`, which reads one value; then only whitespace may follow.
    private static func reading<T>(
        _ bytes: [UInt8], maximumDepth: Int, allowsDuplicateKeys: Bool,
        _ read: (inout JSONReader) throws(JSONError) -> T
    ) throws(JSONError) -> T {
        try bytes.withUnsafeBufferPointer { buffer throws(JSONError) in
            try lending(buffer, maximumDepth: maximumDepth, allowsDuplicateKeys: allowsDuplicateKeys) {
                reader throws(JSONError) in
                if buffer.starts(with: [0xEF, 0xBB, 0xBF]) {
                    throw reader.error(
                        "starts with a UTF-8 byte-order mark (EF BB BF), which JSON must not (RFC 8259): "
                            + "save it as UTF-8 without one")
                }
                reader.skipWhitespace()
                let value = try read(&reader)
                reader.skipWhitespace()
                guard reader.position == buffer.count else {
                    throw reader.error("unexpected text after the JSON value")
                }
                return value
            }
        }
    }

    /// Lends `body` a reader at the start of `buffer`.
    private static func lending<T>(
        _ buffer: UnsafeBufferPointer<UInt8>, maximumDepth: Int, allowsDuplicateKeys: Bool,
        _ body: (inout JSONReader) throws(JSONError) -> T
    ) throws(JSONError) -> T {
        // The reader walks the bytes in place: an unsafe buffer, whose reads cost no bounds check in release builds,
        // is what keeps reading near a few instructions per byte. Member names start on the stack, so that most
        // documents allocate nothing for them.
        try withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 512) { nameBytes throws(JSONError) in
            try withUnsafeTemporaryAllocation(of: Range<Int>.self, capacity: 32) { names throws(JSONError) in
                var reader = JSONReader(
                    bytes: buffer, maximumDepth: maximumDepth, allowsDuplicateKeys: allowsDuplicateKeys,
                    nameBytes: Scratch(lent: nameBytes), names: Scratch(lent: names))
                defer {
                    reader.nameBytes.release()
                    reader.names.release()
                }
                return try body(&reader)
            }
        }
    }

    private init(
        bytes: UnsafeBufferPointer<UInt8>, maximumDepth: Int, allowsDuplicateKeys: Bool,
        nameBytes: Scratch<UInt8>, names: Scratch<Range<Int>>
    ) {
        self.bytes = bytes
        self.maximumDepth = maximumDepth
        self.allowsDuplicateKeys = allowsDuplicateKeys
        self.nameBytes = nameBytes
        self.names = names
    }

    private func error(_ message: String) -> JSONError { JSONError(offset: position, message: message) }

    private mutating func skipWhitespace() { position = JSONBytes.pastWhitespace(bytes, from: position) }

    // MARK: reading member by member

    private mutating func readMembers(
        known: JSONNames,
        member: (inout JSONReader, Int?) throws(JSONError) -> Void
    ) throws(JSONError) {
        try eachMember(depth: 1) { reader, name throws(JSONError) in
            let start = reader.position
            try member(&reader, known.index(of: reader.bytes(ofName: name)))
            if reader.position == start { try reader.skipNested(depth: reader.memberDepth) }
        }
    }

    /// Reads a member's value whole.
    public mutating func readValue() throws(JSONError) -> JSONValue { try parseValue(depth: memberDepth) }

    /// Checks a member's value as strictly as `readValue` would read it, building only a scalar: an object or array
    /// comes back empty, of its kind.
    public mutating func checkValue() throws(JSONError) -> JSONValue {
        guard position < bytes.count else { throw error("unexpected end of JSON") }
        switch bytes[position] {
        case UInt8(ascii: "{"):
            try skipObject(depth: memberDepth + 1)
            return .object([])
        case UInt8(ascii: "["):
            try skipArray(depth: memberDepth + 1)
            return .array([])
        default:
            return try parseValue(depth: memberDepth)
        }
    }

    /// Reads a member's value that should be an array of strings straight into Strings (no `JSONValue` per
    /// element); anything else is read and described.
    public mutating func readStrings() throws(JSONError) -> JSONStrings {
        guard position < bytes.count, bytes[position] == UInt8(ascii: "[") else { return .other(try readValue()) }
        var strings: [String] = []
        strings.reserveCapacity(JSONBytes.leadingStringCount(bytes, at: position))
        var notAString: (index: Int, typeName: String)?
        try eachElement(depth: memberDepth + 1) { reader throws(JSONError) in
            if reader.position < reader.bytes.count, reader.bytes[reader.position] == UInt8(ascii: "\"") {
                let text = try reader.parseString()
                if notAString == nil { strings.append(text) }
            } else {
                let element = try reader.parseValue(depth: reader.memberDepth + 1)
                if notAString == nil { notAString = (strings.count, element.typeName) }
            }
        }
        if let notAString { return .notAString(index: notAString.index, typeName: notAString.typeName) }
        return .strings(strings)
    }

    // MARK: building

    private mutating func parseValue(depth: Int) throws(JSONError) -> JSONValue {
        guard position < bytes.count else { throw error("unexpected end of JSON") }
        switch bytes[position] {
        case UInt8(ascii: "{"): return try parseObject(depth: depth + 1)
        case UInt8(ascii: "["): return try parseArray(depth: depth + 1)
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"):
            try expectLiteral("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expectLiteral("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expectLiteral("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try parseNumber())
        default:
            let byte = bytes[position]
            // A byte of a multi-byte character would print as the wrong character: name it by its value.
            throw error(
                byte < 0x80
                    ? "unexpected character '\(Character(Unicode.Scalar(byte)))'"
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
        try eachMember(depth: depth) { reader, name throws(JSONError) in
            let key = reader.text(ofName: name)
            let start = reader.position
            let value = try reader.parseValue(depth: depth)
            members.append(JSONMember(key: key, value: value, range: start..<reader.position))
        }
        return .object(members)
    }

    /// Reads the object whose opening brace is at `position`, at `depth`, to its end: each member's name (checked
    /// against the object's others), then `value`, which reads the member's value, told where the name's bytes are.
    @inline(__always)
    private mutating func eachMember(
        depth: Int,
        _ value: (inout JSONReader, _ name: Range<Int>) throws(JSONError) -> Void
    ) throws(JSONError) {
        guard try opens(depth: depth, closing: UInt8(ascii: "}")) else { return }
        var names = MemberNames(from: self.names.count, byte: nameBytes.count)
        defer { forget(names) }
        while true {
            let name = try memberName(into: &names)
            try colon()
            try value(&self, name)
            guard try continues(closing: UInt8(ascii: "}"), in: "an object") else { return }
        }
    }

    /// Reads the array whose opening bracket is at `position`, at `depth`, to its end, `element` reading each element.
    @inline(__always)
    private mutating func eachElement(depth: Int, _ element: (inout JSONReader) throws(JSONError) -> Void)
        throws(JSONError)
    {
        guard try opens(depth: depth, closing: UInt8(ascii: "]")) else { return }
        while true {
            skipWhitespace()
            try element(&self)
            guard try continues(closing: UInt8(ascii: "]"), in: "an array") else { return }
        }
    }

    // The small steps of reading (a colon, a comma or bracket, a name, a plain string) are inlined where they are
    // taken: a call each cost about as much as the step, a few hundred instructions for every job's body. So are the
    // loops over an object's members and an array's elements, and with them the closure each caller gives.
    @inline(__always)
    private mutating func colon() throws(JSONError) {
        skipWhitespace()
        guard position < bytes.count, bytes[position] == UInt8(ascii: ":") else { throw error("expected ':'") }
        position += 1
        skipWhitespace()
    }

    // MARK: member names

    /// The names of one object so far: those in `names` from `first` on (their bytes from `byte` on), then, past 16
    /// of them, a set, so that a hostile object of many members costs linear time.
    private struct MemberNames {
        let first: Int
        let byte: Int
        /// Names as bytes, compared as below 16 names: canonically equivalent but different text (é precomposed and
        /// decomposed) is two names, as for the readers whose disagreement the check is about.
        var set: Set<[UInt8]>?

        init(from first: Int, byte: Int) {
            self.first = first
            self.byte = byte
        }
    }

    /// Drops the names of an object read to its end.
    private mutating func forget(_ object: MemberNames) {
        names.removeLast(names.count - object.first)
        nameBytes.removeLast(nameBytes.count - object.byte)
    }

    /// Reads a member name, refusing one the object already has unless duplicates are allowed: readers disagree
    /// about such a document (this one would take the first value; Python, JavaScript and Go take the last). Returns
    /// where its bytes are (`bytes(ofName:)`).
    private mutating func memberName(into object: inout MemberNames) throws(JSONError) -> Range<Int> {
        skipWhitespace()
        guard position < bytes.count, bytes[position] == UInt8(ascii: "\"") else {
            throw error("expected a member name")
        }
        let start = position
        let name = try readName()
        guard !allowsDuplicateKeys else { return name }
        let repeated: Bool
        if object.set == nil && names.count - object.first < 16 {
            let new = bytes(ofName: name)
            var index = object.first
            while index < names.count && !JSONBytes.same(bytes(ofName: names[index]), new) { index += 1 }
            repeated = index < names.count
            names.append(name)
        } else {
            if object.set == nil {
                object.set = Set((object.first..<names.count).map { Array(bytes(ofName: names[$0])) })
            }
            repeated = !object.set!.insert(Array(bytes(ofName: name))).inserted
        }
        if repeated {
            position = start
            throw error("duplicate key \"\(text(ofName: name).prefix(64))\"")
        }
        return name
    }

    private func text(ofName name: Range<Int>) -> String {
        String(decoding: bytes(ofName: name), as: UTF8.self)
    }

    /// A name's bytes: a range below the document's length is in the document; one past it is in `nameBytes`, offset
    /// by that length.
    @inline(__always)
    private func bytes(ofName name: Range<Int>) -> UnsafeBufferPointer<UInt8> {
        if name.lowerBound < bytes.count {
            return UnsafeBufferPointer(start: bytes.baseAddress! + name.lowerBound, count: name.count)
        }
        return nameBytes[(name.lowerBound - bytes.count)..<(name.upperBound - bytes.count)]
    }

    /// Reads the name at `position` (its opening quote) and past it: where its bytes are, in the document for a name
    /// without escapes, or in `nameBytes` once they are resolved.
    @inline(__always)
    private mutating func readName() throws(JSONError) -> Range<Int> {
        let start = position + 1
        if let text = try plainString() { return start..<(start + text.count) }
        var name = try parseString()
        let first = bytes.count + nameBytes.count
        name.withUTF8 { nameBytes.append(contentsOf: $0) }
        return first..<(bytes.count + nameBytes.count)
    }

    /// The bytes of the string whose opening quote is at `position` when it holds no escape and no control
    /// character (most strings: names, ids, tokens, topics), checked as UTF-8 and read past; nil, with nothing read,
    /// otherwise (the full reader then resolves or refuses it).
    @inline(__always)
    private mutating func plainString() throws(JSONError) -> UnsafeBufferPointer<UInt8>? {
        let start = position + 1
        var scan = start
        // Eight bytes at a time up to the first that ends the string or makes it need the full reader (a quote, a
        // backslash, a control character); bytes of 0x80 and above only mark it as needing UTF-8 validation.
        let raw = UnsafeRawPointer(bytes.baseAddress!)
        var high: UInt64 = 0
        var stopFound = false
        while scan + 8 <= bytes.count {
            let word = raw.loadUnaligned(fromByteOffset: scan, as: UInt64.self)
            let stops = JSONBytes.stops(in: word)
            if stops != 0 {
                let offset = stops.trailingZeroBitCount >> 3
                high |= word & ((1 &<< (offset &* 8)) &- 1)
                scan += offset
                stopFound = true
                break
            }
            high |= word
            scan += 8
        }
        // The last few bytes of the document, one at a time.
        while !stopFound && scan < bytes.count {
            let byte = bytes[scan]
            if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte < 0x20 {
                stopFound = true
            } else {
                high |= UInt64(byte)
                scan += 1
            }
        }
        guard stopFound, bytes[scan] == UInt8(ascii: "\"") else { return nil }
        let text = UnsafeBufferPointer(rebasing: bytes[start..<scan])
        // ASCII needs no validation.
        if high & 0x8080_8080_8080_8080 != 0 && String(validating: text, as: UTF8.self) == nil {
            position = start
            throw error("string is not UTF-8")
        }
        position = scan + 1
        return text
    }

    /// Enters an object or array at `depth` (its opening bracket is at `position`): false if it is empty (and then
    /// read to its end).
    @inline(__always)
    private mutating func opens(depth: Int, closing: UInt8) throws(JSONError) -> Bool {
        guard depth <= maximumDepth else {
            var tooDeep = error("nesting deeper than \(maximumDepth) levels")
            tooDeep.isTooDeep = true
            throw tooDeep
        }
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
    @inline(__always)
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
        try eachElement(depth: depth) { reader throws(JSONError) in elements.append(try reader.parseValue(depth: depth))
        }
        return .array(elements)
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
        if try plainString() == nil { _ = try parseString() }
    }

    private mutating func skipObject(depth: Int) throws(JSONError) {
        try eachMember(depth: depth) { reader, _ throws(JSONError) in try reader.skipNested(depth: depth) }
    }

    private mutating func skipArray(depth: Int) throws(JSONError) {
        try eachElement(depth: depth) { reader throws(JSONError) in try reader.skipNested(depth: depth) }
    }

    private mutating func parseString() throws(JSONError) -> String {
        // Most strings have no escape: one scan, then one String from the bytes (one copy for ASCII).
        if let text = try plainString() { return String(decoding: text, as: UTF8.self) }
        position += 1
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
                            bytes[position + 1] == UInt8(ascii: "u")
                        else { throw error("lone surrogate in \\u escape") }
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

    /// Four hex digits, each checked: a number parser would take a sign ("+041", "-000").
    private mutating func parseHex4() throws(JSONError) -> UInt32 {
        guard position + 4 <= bytes.count else { throw error("invalid \\u escape") }
        var value: UInt32 = 0
        for byte in bytes[position..<position + 4] {
            guard let digit = Character(Unicode.Scalar(byte)).hexDigitValue else { throw error("invalid \\u escape") }
            value = value << 4 | UInt32(digit)
        }
        position += 4
        return value
    }
}
