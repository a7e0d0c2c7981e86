/// URL percent-decoding (RFC 3986) for the credentials and paths of the broker's and Redis's URLs, so that '/', '@', ':'
/// or '%' can be part of a password.
public enum PercentEncoding {
    /// nil for a broken escape or bytes that are not UTF-8.
    public static func decode(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        var iterator = Array(text.utf8).makeIterator()
        while let byte = iterator.next() {
            if byte == UInt8(ascii: "%") {
                guard let high = iterator.next(), let low = iterator.next(),
                      let value = UInt8(String(decoding: [high, low], as: UTF8.self), radix: 16) else { return nil }
                bytes.append(value)
            } else {
                bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }
}
