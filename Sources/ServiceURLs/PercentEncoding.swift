/// URL percent-decoding (RFC 3986) for the credentials and paths of the broker's and Redis's URLs, so that '/', '@', ':'
/// or '%' can be part of a password; and percent-encoding of chosen bytes, for names that must not contain them.
public enum PercentEncoding {
    /// `text` with `%` and each of `reserved` (ASCII) written `%XX`; the same string when it holds none of them.
    public static func encode(_ text: String, reserving reserved: [UInt8]) -> String {
        func needsEscape(_ byte: UInt8) -> Bool { byte == UInt8(ascii: "%") || reserved.contains(byte) }
        guard text.utf8.contains(where: needsEscape) else { return text }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count + 8)
        let hex = Array("0123456789ABCDEF".utf8)
        for byte in text.utf8 {
            if needsEscape(byte) {
                bytes += [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]]
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// nil for a broken escape or bytes that are not UTF-8.
    public static func decode(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        var iterator = Array(text.utf8).makeIterator()
        while let byte = iterator.next() {
            if byte == UInt8(ascii: "%") {
                guard let high = iterator.next(), let low = iterator.next(),
                    let value = UInt8(String(decoding: [high, low], as: UTF8.self), radix: 16)
                else { return nil }
                bytes.append(value)
            } else {
                bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }
}
