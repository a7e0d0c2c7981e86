/// `JSONReader.checkObject` for the objects most payloads are, in one loop over their bytes: strings of printable
/// ASCII without escapes, objects of at most 16 members, and no more than 32 names open at once. It accepts only what
/// the reader accepts, as far as the reader reads (the same grammar, depth limit and duplicate-name rule), and gives
/// up (nil) at anything else, valid or not: the reader then checks the object from its start and names what is wrong.
///
/// Why: the reader checks a value through its general steps (a closure per member, names kept in growable storage);
/// for a single-token job's payload that was about 1,700 instructions, a thirtieth of the whole job.
/// The state is in local variables of one function, its steps inlined into it, so that it stays in registers.
enum JSONQuickCheck {
    static let namesOpen = 32
    static let membersCompared = 16
    static let levels = 63

    /// Where the object at `offset` ends, checked; nil to leave it to the reader.
    static func objectEnd(
        in bytes: UnsafeBufferPointer<UInt8>, at offset: Int, depth: Int, maximumDepth: Int
    ) -> Int? {
        guard (0..<bytes.count).contains(offset), bytes[offset] == UInt8(ascii: "{") else { return nil }
        // The deepest container it may open, counted from the object at `offset`.
        let deepest = min(maximumDepth - depth, levels - 1)
        guard deepest >= 0 else { return nil }
        return withUnsafeTemporaryAllocation(of: Range<Int>.self, capacity: namesOpen) { names in
            withUnsafeTemporaryAllocation(of: Int.self, capacity: levels + 1) { first in
                run(bytes, from: offset, deepest: deepest, names: names, first: first)
            }
        }
    }

    /// Each turn reads one value (opening a container reads its first member's name, or its end), then what follows
    /// it: the brackets it closes, and a comma with the next member's name.
    private static func run(
        _ bytes: UnsafeBufferPointer<UInt8>, from offset: Int, deepest: Int,
        names: UnsafeMutableBufferPointer<Range<Int>>, first: UnsafeMutableBufferPointer<Int>
    ) -> Int? {
        var position = offset
        // Open containers, innermost in bit 0: 1 for an object, 0 for an array.
        var kinds: UInt64 = 0
        var level = 0
        var nameCount = 0
        while true {
            position = JSONBytes.pastWhitespace(bytes, from: position)
            guard position < bytes.count else { return nil }
            switch bytes[position] {
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                let object = bytes[position] == UInt8(ascii: "{")
                // `level` counts the containers open: the new one is at relative depth `level`.
                guard level <= deepest else { return nil }
                kinds = kinds << 1 | (object ? 1 : 0)
                level += 1
                first[level] = nameCount
                position = JSONBytes.pastWhitespace(bytes, from: position + 1)
                guard position < bytes.count else { return nil }
                if bytes[position] != (object ? UInt8(ascii: "}") : UInt8(ascii: "]")) {
                    if object {
                        guard name(bytes, &position, names, &nameCount, from: first[level]) else { return nil }
                    }
                    continue
                }
                position += 1
                close(&level, &kinds, &nameCount, first)
            case UInt8(ascii: "\""):
                guard plainString(bytes, &position) != nil else { return nil }
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                guard number(bytes, &position) else { return nil }
            case UInt8(ascii: "t"): guard literal("true", bytes, &position) else { return nil }
            case UInt8(ascii: "f"): guard literal("false", bytes, &position) else { return nil }
            case UInt8(ascii: "n"): guard literal("null", bytes, &position) else { return nil }
            default: return nil
            }
            // After a value: close what ends here, then read on past a comma.
            while true {
                if level == 0 { return position }
                position = JSONBytes.pastWhitespace(bytes, from: position)
                guard position < bytes.count else { return nil }
                let byte = bytes[position]
                let object = kinds & 1 == 1
                position += 1
                if byte == UInt8(ascii: ",") {
                    if object {
                        guard name(bytes, &position, names, &nameCount, from: first[level]) else { return nil }
                    }
                    break
                }
                guard byte == (object ? UInt8(ascii: "}") : UInt8(ascii: "]")) else { return nil }
                close(&level, &kinds, &nameCount, first)
            }
        }
    }

    /// Leaves the innermost container: its names are forgotten.
    @inline(__always)
    private static func close(
        _ level: inout Int, _ kinds: inout UInt64, _ nameCount: inout Int, _ first: UnsafeMutableBufferPointer<Int>
    ) {
        nameCount = first[level]
        level -= 1
        kinds >>= 1
    }

    /// A member's name, checked against the names from `start` on (the object's others), and the colon after it.
    @inline(__always)
    private static func name(
        _ bytes: UnsafeBufferPointer<UInt8>, _ position: inout Int, _ names: UnsafeMutableBufferPointer<Range<Int>>,
        _ nameCount: inout Int, from start: Int
    ) -> Bool {
        position = JSONBytes.pastWhitespace(bytes, from: position)
        guard position < bytes.count, bytes[position] == UInt8(ascii: "\""),
            let name = plainString(bytes, &position),
            nameCount - start < membersCompared, nameCount < namesOpen
        else { return false }
        for index in start..<nameCount where same(bytes, names[index], name) { return false }
        names[nameCount] = name
        nameCount += 1
        position = JSONBytes.pastWhitespace(bytes, from: position)
        guard position < bytes.count, bytes[position] == UInt8(ascii: ":") else { return false }
        position += 1
        return true
    }

    @inline(__always)
    private static func same(_ bytes: UnsafeBufferPointer<UInt8>, _ a: Range<Int>, _ b: Range<Int>) -> Bool {
        guard a.count == b.count else { return false }
        for offset in 0..<a.count where bytes[a.lowerBound + offset] != bytes[b.lowerBound + offset] { return false }
        return true
    }

    /// A string of printable ASCII without escapes (its opening quote at `position`): where its bytes are, past its
    /// closing quote. Eight bytes at a time, as the reader's own scan.
    @inline(__always)
    private static func plainString(_ bytes: UnsafeBufferPointer<UInt8>, _ position: inout Int) -> Range<Int>? {
        let start = position + 1
        var scan = start
        var high: UInt64 = 0
        let raw = UnsafeRawPointer(bytes.baseAddress!)
        var stopped = false
        while scan + 8 <= bytes.count {
            let word = raw.loadUnaligned(fromByteOffset: scan, as: UInt64.self)
            let stops = JSONBytes.stops(in: word)
            if stops != 0 {
                let offset = stops.trailingZeroBitCount >> 3
                high |= word & ((1 &<< (offset &* 8)) &- 1)
                scan += offset
                stopped = true
                break
            }
            high |= word
            scan += 8
        }
        while !stopped && scan < bytes.count {
            let byte = bytes[scan]
            if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte < 0x20 { break }
            high |= UInt64(byte)
            scan += 1
        }
        guard scan < bytes.count, bytes[scan] == UInt8(ascii: "\""), high & 0x8080_8080_8080_8080 == 0 else {
            return nil
        }
        position = scan + 1
        return start..<scan
    }

    /// A number as JSON writes it (the reader's `scanNumber`).
    @inline(__always)
    private static func number(_ bytes: UnsafeBufferPointer<UInt8>, _ position: inout Int) -> Bool {
        if bytes[position] == UInt8(ascii: "-") { position += 1 }
        let integerStart = position
        let integerDigits = digits(bytes, &position)
        guard integerDigits > 0, integerDigits == 1 || bytes[integerStart] != UInt8(ascii: "0") else { return false }
        if position < bytes.count, bytes[position] == UInt8(ascii: ".") {
            position += 1
            guard digits(bytes, &position) > 0 else { return false }
        }
        if position < bytes.count, bytes[position] | 0x20 == UInt8(ascii: "e") {
            position += 1
            if position < bytes.count, bytes[position] == UInt8(ascii: "+") || bytes[position] == UInt8(ascii: "-") {
                position += 1
            }
            guard digits(bytes, &position) > 0 else { return false }
        }
        return true
    }

    @inline(__always)
    private static func digits(_ bytes: UnsafeBufferPointer<UInt8>, _ position: inout Int) -> Int {
        let begin = position
        while position < bytes.count, bytes[position] &- UInt8(ascii: "0") < 10 { position += 1 }
        return position - begin
    }

    @inline(__always)
    private static func literal(_ text: StaticString, _ bytes: UnsafeBufferPointer<UInt8>, _ position: inout Int)
        -> Bool
    {
        let count = text.utf8CodeUnitCount
        guard position + count <= bytes.count else { return false }
        for offset in 0..<count where bytes[position + offset] != text.utf8Start[offset] { return false }
        position += count
        return true
    }
}
