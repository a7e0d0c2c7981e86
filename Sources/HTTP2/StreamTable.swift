/// A connection's open streams by stream identifier: an open-addressing table indexed by the identifier itself.
///
/// A connection's identifiers come one side's at a time and in increasing order (odd from a client, even from a
/// server), so half the identifier, masked, puts consecutive streams in consecutive slots: a lookup is an index and
/// a comparison, where a dictionary hashed every identifier (several times per request: submitted, headers sent,
/// body read, each answer field, closed). Kept at most half full; removal shifts the following entries back, so no
/// tombstones accumulate over a connection's millions of streams.
struct StreamTable {
    private var slots: [(id: Int32, stream: HTTP2Stream)?]
    private var mask: Int
    private(set) var count = 0

    init() {
        slots = Array(repeating: nil, count: 16)
        mask = 15
    }

    var isEmpty: Bool { count == 0 }

    private func home(_ id: Int32) -> Int { Int(UInt32(bitPattern: id) >> 1) & mask }

    /// The slot holding `id`, or the empty slot where it would go.
    private func slot(of id: Int32) -> (index: Int, found: Bool) {
        var index = home(id)
        while let entry = slots[index] {
            if entry.id == id { return (index, true) }
            index = (index + 1) & mask
        }
        return (index, false)
    }

    subscript(id: Int32) -> HTTP2Stream? {
        get {
            let (index, found) = slot(of: id)
            return found ? slots[index]!.stream : nil
        }
        set {
            guard let newValue else {
                removeValue(forKey: id)
                return
            }
            let (index, found) = slot(of: id)
            slots[index] = (id, newValue)
            if !found {
                count += 1
                if count * 2 > slots.count { grow() }
            }
        }
    }

    @discardableResult
    mutating func removeValue(forKey id: Int32) -> HTTP2Stream? {
        let (index, found) = slot(of: id)
        guard found else { return nil }
        let removed = slots[index]!.stream
        slots[index] = nil
        count -= 1
        // Entries after the hole that could sit in it (their home is not strictly between the hole and them) move
        // back, so that every entry stays reachable from its home without tombstones.
        var hole = index, next = (index + 1) & mask
        while let entry = slots[next] {
            let home = home(entry.id)
            let stays = hole <= next ? (hole < home && home <= next) : (hole < home || home <= next)
            if !stays {
                slots[hole] = entry
                slots[next] = nil
                hole = next
            }
            next = (next + 1) & mask
        }
        return removed
    }

    mutating func removeAll() {
        slots = Array(repeating: nil, count: 16)
        mask = 15
        count = 0
    }

    /// Every stream, by increasing identifier.
    var entries: [(id: Int32, stream: HTTP2Stream)] {
        slots.compactMap { $0 }.sorted { $0.id < $1.id }
    }

    private mutating func grow() {
        let old = slots
        slots = Array(repeating: nil, count: old.count * 2)
        mask = slots.count - 1
        for case let entry? in old {
            let (index, _) = slot(of: entry.id)
            slots[index] = entry
        }
    }
}
