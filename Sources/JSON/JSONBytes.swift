/// Byte-level steps of reading JSON that need nothing of a reader's state.
public enum JSONBytes {
    /// Where the whitespace JSON allows between tokens (space, tab, line feed, carriage return) ends, from `position`.
    @inline(__always)
    public static func pastWhitespace(_ bytes: UnsafeBufferPointer<UInt8>, from position: Int) -> Int {
        var position = position
        while position < bytes.count {
            switch bytes[position] {
            case 0x20, 0x09, 0x0A, 0x0D: position += 1
            default: return position
            }
        }
        return position
    }

    /// How many strings the array at `position` of `bytes` begins with: what a reader of an array of strings reserves
    /// (`JSONReader.readStrings`, `PushJob.decodeUsual`), so that a campaign's hundred thousand users take one buffer
    /// of their size, not a doubling one of up to twice it (and both buffers while it grows). A hint only: it stops
    /// at whatever is not a string. Not counted in small documents (a few hundred instructions for a single token,
    /// where growing costs nothing).
    public static func leadingStringCount(_ bytes: UnsafeBufferPointer<UInt8>, at position: Int) -> Int {
        guard bytes.count - position > 16 << 10 else { return 0 }
        var index = position + 1
        var count = 0
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D, UInt8(ascii: ","): index += 1
            case UInt8(ascii: "\""):
                count += 1
                index += 1
                while index < bytes.count, bytes[index] != UInt8(ascii: "\"") {
                    index += bytes[index] == UInt8(ascii: "\\") ? 2 : 1
                }
                index += 1
            default: return count
            }
        }
        return count
    }

    /// The top bit of each byte of `word` that is a quote, a backslash or below 0x20, and perhaps of bytes above the
    /// lowest such byte, never below it: each test sets a byte's top bit when the byte is zero (after the XOR) or below
    /// 0x20, a borrow only ever reaches higher bytes, and a byte of 0x80 and above is masked out by `~word`. So the
    /// lowest bit set marks the first byte that stops a string.
    static func stops(in word: UInt64) -> UInt64 {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let quotes = word ^ (ones &* 0x22)
        let backslashes = word ^ (ones &* 0x5C)
        let found =
            ((quotes &- ones) & ~quotes) | ((backslashes &- ones) & ~backslashes) | ((word &- ones &* 0x20) & ~word)
        return found & (ones &* 0x80)
    }

    static func same(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Bool {
        guard a.count == b.count else { return false }
        for index in 0..<a.count where a[index] != b[index] { return false }
        return true
    }
}
