/// What may be sent as the value of an APNs request header. HTTP/2 forbids control characters in field values and
/// leading or trailing whitespace (RFC 9113, 8.2.1); a server that meets them resets the stream, and a request retried
/// after that would only be reset again. So such values are refused before anything is sent, naming the problem.
public enum HeaderValue {
    /// nil when `value` can be sent; otherwise what is wrong with it. `allowsInnerSpaces`: spaces between words are
    /// fine (a collapse id); a topic holds no whitespace at all.
    public static func problem(_ value: String, allowsInnerSpaces: Bool) -> String? {
        // One pass over contiguous UTF-8: this runs for every notification sent.
        var value = value
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
}
