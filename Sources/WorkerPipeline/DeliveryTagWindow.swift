/// Values kept by delivery tag. A channel numbers its deliveries 1, 2, 3, ... in the order it sends them, so they are
/// kept in a window of slots from the oldest tag held on: no hash per delivery, and the oldest, which every
/// acknowledgement asks for, at hand. A tag out of that order (below the window, or far past it: which a broker does
/// not send) goes to a dictionary beside it, so that nothing is ever forgotten.
///
/// Inlinable, so that the broker's module gets it specialized for its values: used generically, each call looked up
/// `Value?`'s type at run time.
public struct DeliveryTagWindow<Value> {
    /// `slots[head + i]`: the value of tag `first + i`. Tags skipped over (never received here) are nil.
    @usableFromInline var slots: [Value?] = []
    @usableFromInline var head = 0
    @usableFromInline var first: UInt64 = 0
    @usableFromInline var outsideWindow: [UInt64: Value] = [:]

    @inlinable public init() {}

    @inlinable var windowEnd: UInt64 { first + UInt64(slots.count - head) }

    /// Keeps `value` for `tag`; false if the tag was held already (its value is then replaced).
    @inlinable @discardableResult
    public mutating func insert(_ value: Value, for tag: UInt64) -> Bool {
        if !outsideWindow.isEmpty && outsideWindow[tag] != nil {
            outsideWindow[tag] = value
            return false
        }
        if head == slots.count {
            slots.removeAll(keepingCapacity: true)
            head = 0
            first = tag
            slots.append(value)
        } else if tag >= windowEnd && tag - windowEnd < 1 << 16 {
            if tag > windowEnd { slots.append(contentsOf: repeatElement(nil, count: Int(tag - windowEnd))) }
            slots.append(value)
        } else if tag >= first && tag < windowEnd {
            let index = head + Int(tag - first)
            let wasHeld = slots[index] != nil
            slots[index] = value
            return !wasHeld
        } else {
            outsideWindow[tag] = value
        }
        return true
    }

    /// Drops `tag`, returning its value (nil if it was not held).
    @inlinable @discardableResult
    public mutating func remove(_ tag: UInt64) -> Value? {
        if !outsideWindow.isEmpty, let value = outsideWindow.removeValue(forKey: tag) { return value }
        guard tag >= first && tag < windowEnd else { return nil }
        // Taken out of its slot (moved, not copied and then released).
        guard let value = slots[head + Int(tag - first)].take() else { return nil }
        while head < slots.count && slots[head] == nil {
            head += 1
            first += 1
        }
        // The emptied front is dropped in bulk, not one slot at a time.
        if head == slots.count {
            slots.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 1024 && head >= slots.count / 2 {
            slots.removeFirst(head)
            head = 0
        }
        return value
    }

    /// The oldest tag held.
    @inlinable public var oldest: UInt64? {
        let inWindow: UInt64? = head < slots.count ? first : nil
        guard let lowest = outsideWindow.keys.min() else { return inWindow }
        return min(lowest, inWindow ?? .max)
    }

    /// Every value held, the window's in tag order first.
    @inlinable public var values: [Value] { slots[head...].compactMap { $0 } + outsideWindow.values }
}
