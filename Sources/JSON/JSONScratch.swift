/// Growable storage that starts in memory its owner lends (on the stack) and moves to the heap only when it outgrows
/// it; `release` frees what it allocated. For the reader's member names (bytes and ranges, trivial values that need no
/// deinitializing), which most documents keep within the loan.
struct Scratch<Element> {
    private var base: UnsafeMutablePointer<Element>
    private var capacity: Int
    private(set) var count = 0
    private var allocated = false

    init(lent: UnsafeMutableBufferPointer<Element>) {
        base = lent.baseAddress!
        capacity = lent.count
    }

    subscript(index: Int) -> Element { base[index] }

    subscript(range: Range<Int>) -> UnsafeBufferPointer<Element> {
        UnsafeBufferPointer(start: base + range.lowerBound, count: range.count)
    }

    mutating func append(_ element: Element) {
        if count == capacity { grow(to: count + 1) }
        base[count] = element
        count += 1
    }

    mutating func append(contentsOf elements: UnsafeBufferPointer<Element>) {
        guard let start = elements.baseAddress else { return }
        if count + elements.count > capacity { grow(to: count + elements.count) }
        (base + count).initialize(from: start, count: elements.count)
        count += elements.count
    }

    mutating func removeLast(_ k: Int) { count -= k }

    func release() {
        if allocated { base.deallocate() }
    }

    private mutating func grow(to needed: Int) {
        let larger = max(needed, capacity * 2)
        let moved = UnsafeMutablePointer<Element>.allocate(capacity: larger)
        moved.initialize(from: base, count: count)
        release()
        base = moved
        capacity = larger
        allocated = true
    }
}
