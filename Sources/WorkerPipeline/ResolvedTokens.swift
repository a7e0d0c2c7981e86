#if canImport(Glibc)
    import Glibc
#endif

/// Entries' cached tokens (users', or Live Activities' by activity id), looked up by name: what resolving a batch
/// found. An entry that was not asked for, or could not be read, has none (nil); an entry read empty has [].
///
/// The tokens of every entry sit in one array, each entry's together, and names are found through a table of their
/// own: a dictionary of arrays cost each user an array of its own and two SipHash hashings of the name (one to tell
/// the batch's users apart, one to look the user up), about a third of what resolving a user costs.
public struct ResolvedTokens: Sendable, ExpressibleByDictionaryLiteral {
    private var names = NameTable()
    /// Every entry's tokens, each entry's together (`spans`).
    private var tokens: [CachedToken] = []
    /// Per entry (by its index in `names`), where its tokens are; nil for an entry never read whole.
    private var spans: [Range<Int>?] = []

    public init() {}

    public init(_ entries: [String: [CachedToken]]) {
        var builder = Builder(capacity: entries.count)
        for (name, tokens) in entries {
            guard let index = builder.add(name) else { continue }
            builder.markRead(index)
            for token in tokens { builder.append(token, to: index) }
        }
        self = builder.build()
    }

    public init(dictionaryLiteral elements: (String, [CachedToken])...) {
        self.init(Dictionary(elements, uniquingKeysWith: +))
    }

    /// The entry's tokens; nil for an entry not resolved.
    public subscript(name: String) -> ArraySlice<CachedToken>? {
        guard let index = names.index(of: name), let span = spans[index] else { return nil }
        return tokens[span]
    }

    /// Fills a `ResolvedTokens`: each name added once, in the order of first asking (`add`), its tokens appended as
    /// they are read, entry by entry in any order.
    package struct Builder {
        private var names = NameTable()
        private var tokens: [CachedToken] = []
        /// Per token, its entry's index: tokens read out of entry order are put together once, in `build`.
        private var owners: [Int32] = []
        private var read: [Bool] = []
        private var inEntryOrder = true

        /// How far a name table probes before it moves to a dictionary (`NameTable`): far more than a fairly hashed
        /// table at most half full probes.
        package static let defaultLongestProbe = 64

        /// `longestProbe`: see `NameTable` (tests lower it to reach the dictionary it moves to).
        package init(capacity: Int, longestProbe: Int = defaultLongestProbe) {
            names = NameTable(longestProbe: longestProbe)
            names.reserve(capacity)
            read.reserveCapacity(capacity)
            tokens.reserveCapacity(capacity)
            owners.reserveCapacity(capacity)
        }

        /// Adds `name` and returns its index; nil if it was added before.
        package mutating func add(_ name: String) -> Int? {
            guard names.insert(name) else { return nil }
            read.append(false)
            return names.names.count - 1
        }

        /// The names added, each once, by index.
        package var uniqueNames: [String] { names.names }

        /// Whether the names moved to a dictionary (a flood of colliding names; tests).
        package var namesInDictionary: Bool { names.isDictionary }

        /// The entry at `index` was read whole: it has its tokens, [] if none (an entry never marked has nil).
        package mutating func markRead(_ index: Int) { read[index] = true }

        /// A token of the entry at `index`: kept only if the entry is marked read (`markRead`) by `build`.
        package mutating func append(_ token: CachedToken, to index: Int) {
            if let last = owners.last, Int(last) > index { inEntryOrder = false }
            tokens.append(token)
            owners.append(Int32(truncatingIfNeeded: index))
        }

        package consuming func build() -> ResolvedTokens {
            if !inEntryOrder {
                let order = owners.indices.sorted { (owners[$0], $0) < (owners[$1], $1) }
                tokens = order.map { tokens[$0] }
                owners = order.map { owners[$0] }
            }
            var spans = [Range<Int>?](repeating: nil, count: read.count)
            var start = 0
            while start < owners.count {
                let owner = Int(owners[start])
                var end = start + 1
                while end < owners.count && owners[end] == owners[start] { end += 1 }
                if read[owner] { spans[owner] = start..<end }
                start = end
            }
            for (index, wasRead) in read.enumerated() where wasRead && spans[index] == nil { spans[index] = 0..<0 }
            var resolved = ResolvedTokens()
            resolved.names = names
            resolved.tokens = tokens
            resolved.spans = spans
            return resolved
        }
    }
}

/// Names, each once, found by their bytes (two spellings of one text, é precomposed and decomposed, are two names, as
/// they are two Redis keys): an open-addressed table of indices into `names`, at most half full, a name's slot taken
/// from a hash of its bytes keyed by a number drawn once per process (so that colliding names are not easily chosen),
/// the next free slot after it on a collision. A table whose probes run past `longestProbe` all the same (a flood of
/// colliding names) moves to a dictionary keyed by the names' bytes: that, not the key, is what bounds the cost of a
/// flood. A table of fairly hashed names, at most half full, seldom probes that far; one that does all the same only
/// gets slower (a lookup then makes an array of the name's bytes).
struct NameTable: Sendable {
    private(set) var names: [String] = []
    /// Per name, its hash.
    private var hashes: [UInt64] = []
    /// Index + 1 of the name in each slot; 0 for a free slot. A power of two long.
    private var slots: [Int32] = []
    private var dictionary: [[UInt8]: Int]?
    private static let key = UInt64.random(in: .min ... .max)
    /// Slots looked at past a name's own before the table gives up on hashing (tests make it 0).
    let longestProbe: Int

    init(longestProbe: Int = ResolvedTokens.Builder.defaultLongestProbe) {
        self.longestProbe = longestProbe
    }

    /// Whether the table moved to a dictionary.
    var isDictionary: Bool { dictionary != nil }

    mutating func reserve(_ count: Int) {
        names.reserveCapacity(count)
        hashes.reserveCapacity(count)
        if slots.count < count * 2 { rehash(slotCount: Self.slotCount(for: count)) }
    }

    /// Adds `name`; false if it is here already.
    mutating func insert(_ name: String) -> Bool {
        if dictionary != nil {
            let bytes = Array(name.utf8)
            guard dictionary![bytes] == nil else { return false }
            dictionary![bytes] = names.count
            names.append(name)
            return true
        }
        if slots.count < (names.count + 1) * 2 { rehash(slotCount: Self.slotCount(for: names.count + 1)) }
        let hash = Self.hash(name, key: Self.key)
        var slot = Int(truncatingIfNeeded: hash) & (slots.count - 1)
        var probes = 0
        while slots[slot] != 0 {
            let index = Int(slots[slot]) - 1
            if hashes[index] == hash && Self.sameBytes(names[index], name) { return false }
            slot = (slot + 1) & (slots.count - 1)
            probes += 1
            if probes > longestProbe {
                dictionary = Dictionary(uniqueKeysWithValues: names.enumerated().map { (Array($1.utf8), $0) })
                return insert(name)
            }
        }
        precondition(names.count < Int32.max, "more names than a table indexes")
        slots[slot] = Int32(truncatingIfNeeded: names.count + 1)
        names.append(name)
        hashes.append(hash)
        return true
    }

    func index(of name: String) -> Int? {
        if let dictionary { return dictionary[Array(name.utf8)] }
        guard !slots.isEmpty else { return nil }
        let hash = Self.hash(name, key: Self.key)
        var slot = Int(truncatingIfNeeded: hash) & (slots.count - 1)
        while slots[slot] != 0 {
            let index = Int(slots[slot]) - 1
            if hashes[index] == hash && Self.sameBytes(names[index], name) { return index }
            slot = (slot + 1) & (slots.count - 1)
        }
        return nil
    }

    /// Byte for byte: `==` on strings takes canonically equivalent spellings for one, which the hash does not.
    private static func sameBytes(_ first: String, _ second: String) -> Bool {
        first.withUTF8Bytes { first in
            second.withUTF8Bytes { second in
                first.count == second.count
                    && (first.isEmpty || memcmp(first.baseAddress!, second.baseAddress!, first.count) == 0)
            }
        }
    }

    private static func slotCount(for count: Int) -> Int {
        max(16, 1 << (Int.bitWidth - (count * 2 - 1).leadingZeroBitCount))
    }

    private mutating func rehash(slotCount: Int) {
        slots = [Int32](repeating: 0, count: slotCount)
        for (index, hash) in hashes.enumerated() {
            var slot = Int(truncatingIfNeeded: hash) & (slotCount - 1)
            while slots[slot] != 0 { slot = (slot + 1) & (slotCount - 1) }
            slots[slot] = Int32(truncatingIfNeeded: index + 1)
        }
    }

    /// A hash of every byte of `name`, eight at a time, each word mixed in by a multiplication and a shift, then
    /// the whole mixed once more (SplitMix64's finalizer): every bit of the result depends on every byte, the low
    /// bits the table takes included.
    static func hash(_ name: String, key: UInt64) -> UInt64 {
        name.withUTF8Bytes { bytes in
            var hash = key ^ (UInt64(bytes.count) &* 0x9E37_79B9_7F4A_7C15)
            let raw = UnsafeRawBufferPointer(bytes)
            var offset = 0
            while offset + 8 <= raw.count {
                hash = (hash ^ raw.loadUnaligned(fromByteOffset: offset, as: UInt64.self)) &* 0xBF58_476D_1CE4_E5B9
                hash ^= hash >> 31
                offset += 8
            }
            var tail: UInt64 = 0
            while offset < raw.count {
                tail = tail << 8 | UInt64(raw[offset])
                offset += 1
            }
            hash ^= tail
            hash = (hash ^ (hash >> 30)) &* 0xBF58_476D_1CE4_E5B9
            hash = (hash ^ (hash >> 27)) &* 0x94D0_49BB_1331_11EB
            return hash ^ (hash >> 31)
        }
    }
}

extension String {
    /// The string's UTF-8 bytes where it keeps them, with no counted reference to it (`withUTF8` needs a `var`
    /// copy); a string not kept as UTF-8 (never made here) is copied first.
    @inline(__always)
    func withUTF8Bytes<T>(_ body: (UnsafeBufferPointer<UInt8>) -> T) -> T {
        if let result = utf8.withContiguousStorageIfAvailable(body) { return result }
        var copy = self
        return copy.withUTF8(body)
    }
}
