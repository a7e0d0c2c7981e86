/// Canonical lowercase UUIDs (version 4 layout) for apns-id values, fast enough for a hot path: Foundation's
/// `UUID()` on Linux opens /dev/urandom and formats with printf on every call. Not for secrets.
public struct APNsIDGenerator: Sendable {
    private var state: UInt64

    public init(seed: UInt64 = UInt64.random(in: .min ... .max)) { state = seed }

    /// SplitMix64: one multiply-xorshift chain per 64 bits.
    private mutating func nextWord() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A fraction in 0..<1, for simulated failure rates.
    public mutating func nextFraction() -> Double { Double(nextWord() >> 11) / Double(1 << 53) }

    public mutating func next() -> String {
        let high = (nextWord() & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000  // version 4
        let low = (nextWord() & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000  // variant 10
        let digits: StaticString = "0123456789abcdef"
        return String(unsafeUninitializedCapacity: 36) { buffer in
            digits.withUTF8Buffer { hex in
                var index = 0
                func put(_ word: UInt64, nibbles: Range<Int>) {
                    for nibble in nibbles.reversed() {
                        buffer[index] = hex[Int((word >> UInt64(nibble * 4)) & 0xF)]
                        index += 1
                    }
                }
                put(high, nibbles: 8..<16)
                buffer[index] = 45
                index += 1
                put(high, nibbles: 4..<8)
                buffer[index] = 45
                index += 1
                put(high, nibbles: 0..<4)
                buffer[index] = 45
                index += 1
                put(low, nibbles: 12..<16)
                buffer[index] = 45
                index += 1
                put(low, nibbles: 0..<12)
            }
            return 36
        }
    }
}
