/// What may be sent as the value of an APNs request header. HTTP/2 forbids control characters in field values and
/// leading or trailing whitespace (RFC 9113, 8.2.1); a server that meets them resets the stream, and a request retried
/// after that would only be reset again. So such values are refused before anything is sent, naming the problem.
public enum HeaderValue {
    /// nil when `value` can be sent; otherwise what is wrong with it. `allowsInnerSpaces`: spaces between words are
    /// fine (a collapse id); a topic holds no whitespace at all.
    public static func problem(_ value: String, allowsInnerSpaces: Bool) -> String? {
        // Over contiguous UTF-8: this runs for every job and every run of notifications sent. Most values have no
        // problem and are looked at once, eight bytes at a time, with a Bool for an answer (a String? out of the
        // closure cost more than the look itself); only a value that may have one is read again to name it.
        var value = value
        guard value.withUTF8(mayHaveProblem) else { return nil }
        return value.withUTF8 { bytes -> String? in
            var space = false
            for byte in bytes {
                if byte < 0x20 || byte == 0x7F {
                    return "holds control character 0x" + String(byte, radix: 16, uppercase: true)
                }
                if byte == 0x20 { space = true }
            }
            if space && !allowsInnerSpaces { return "holds a space" }
            if bytes.first == 0x20 || bytes.last == 0x20 { return "starts or ends with a space" }
            return nil
        }
    }

    /// Whether `bytes` hold a byte below 0x21 (a control character or a space) or 0x7F, eight at a time: most values
    /// hold none, and need no closer look. `(x - 0x21) & ~x` sets a byte's top bit when the byte is below 0x21, and
    /// `x ^ 0x7F` is zero exactly for 0x7F; a borrow only reaches bytes above one already found.
    private static func mayHaveProblem(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let raw = UnsafeRawBufferPointer(bytes)
        var index = 0
        var found: UInt64 = 0
        while index + 8 <= bytes.count {
            let word = raw.loadUnaligned(fromByteOffset: index, as: UInt64.self)
            let deletes = word ^ (ones &* 0x7F)
            found |= ((word &- ones &* 0x21) & ~word) | ((deletes &- ones) & ~deletes)
            index += 8
        }
        if found & (ones &* 0x80) != 0 { return true }
        for byte in bytes[index...] where byte < 0x21 || byte == 0x7F { return true }
        return false
    }
}
