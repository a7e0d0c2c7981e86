import Testing
import WorkerPipeline

/// What the broker thread keeps of deliveries not settled yet (the oldest decides when one `multiple` ack may cover a
/// batch), and what the session keeps of the jobs under way: values by delivery tag.
struct DeliveryTagWindowTests {
    /// Against a dictionary, over random runs of deliveries (in order, with gaps, now and then far past the window,
    /// out of order or twice) and settlements in any order: the same answer to every insert and remove and the same
    /// oldest tag after every step, the same values at the end of a run, and none left once every tag is settled.
    @Test func keepsWhatADictionaryWouldKeep() {
        var generator = Xorshift(state: 0x5EED)
        for _ in 0..<100 {
            var window = DeliveryTagWindow<Int>()
            var model: [UInt64: Int] = [:]
            var next: UInt64 = UInt64.random(in: 1...5, using: &generator)
            for step in 0..<400 {
                switch Int.random(in: 0..<10, using: &generator) {
                case 0..<5:
                    // The next delivery, perhaps after a gap (deliveries this record never saw).
                    next += UInt64.random(in: 0...(Bool.random(using: &generator) ? 0 : 3), using: &generator)
                    // Now and then far past the window (more than its slots are grown for at once).
                    if Int.random(in: 0..<400, using: &generator) == 0 { next += 70_000 }
                    #expect(window.insert(step, for: next) == (model.updateValue(step, forKey: next) == nil))
                    next += 1
                case 5:
                    // Out of order, or twice: what a broker does not do, kept all the same.
                    let tag = UInt64.random(in: 1...next, using: &generator)
                    #expect(window.insert(step, for: tag) == (model.updateValue(step, forKey: tag) == nil))
                default:
                    let tag =
                        model.keys.randomElement(using: &generator) ?? UInt64.random(in: 1...next, using: &generator)
                    #expect(window.remove(tag) == model.removeValue(forKey: tag))
                }
                #expect(window.oldest == model.keys.min())
            }
            #expect(window.values.sorted() == model.values.sorted())
            // Settling every tag still held leaves none: nothing was kept twice or out of sight.
            for tag in model.keys { #expect(window.remove(tag) != nil) }
            #expect(window.oldest == nil && window.values.isEmpty)
        }
    }

    @Test func settlingTheOldestMovesTheOldestOn() {
        var tags = DeliveryTagWindow<Void>()
        for tag: UInt64 in 1...5 { tags.insert((), for: tag) }
        tags.remove(3)
        #expect(tags.oldest == 1)
        tags.remove(1)
        #expect(tags.oldest == 2)
        tags.remove(2)
        #expect(tags.oldest == 4, "3 was settled before")
        tags.remove(4)
        tags.remove(5)
        #expect(tags.oldest == nil)
        tags.insert((), for: 9)
        #expect(tags.oldest == 9)
    }
}

/// Xorshift64*: the same runs every time.
struct Xorshift: RandomNumberGenerator {
    var state: UInt64

    mutating func next() -> UInt64 {
        state ^= state >> 12
        state ^= state << 25
        state ^= state >> 27
        return state &* 0x2545_F491_4F6C_DD1D
    }

    /// A number below `bound`.
    mutating func next(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }
}
