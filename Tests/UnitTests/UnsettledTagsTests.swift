@testable import AMQPBroker
import WorkerPipeline
import Testing

/// The broker thread's record of deliveries not settled yet, which decides when one `multiple` ack may cover a batch.
struct UnsettledTagsTests {
    /// Against a plain set, over random runs of deliveries (in order, with gaps, now and then out of order or twice)
    /// and settlements in any order: the same oldest tag after every step, and none once every tag is settled.
    @Test func keepsWhatASetWouldKeep() {
        var generator = Xorshift(state: 0x5EED)
        for _ in 0..<200 {
            var tags = UnsettledTags()
            var model = Set<UInt64>()
            var next: UInt64 = UInt64.random(in: 1...5, using: &generator)
            for _ in 0..<400 {
                switch Int.random(in: 0..<10, using: &generator) {
                case 0..<5:
                    // The next delivery, perhaps after a gap (deliveries this record never saw).
                    next += UInt64.random(in: 0...(Bool.random(using: &generator) ? 0 : 3), using: &generator)
                    // Now and then far past the window (more than its flags are grown for at once).
                    if Int.random(in: 0..<400, using: &generator) == 0 { next += 70_000 }
                    tags.insert(next)
                    model.insert(next)
                    next += 1
                case 5:
                    // Out of order, or twice: what a broker does not do, kept all the same.
                    let tag = UInt64.random(in: 1...next, using: &generator)
                    tags.insert(tag)
                    model.insert(tag)
                default:
                    let tag = model.randomElement(using: &generator) ?? UInt64.random(in: 1...next, using: &generator)
                    tags.remove(tag)
                    model.remove(tag)
                }
                #expect(tags.oldest == model.min())
            }
            // Settling every tag still unsettled leaves none: nothing was kept twice or out of sight.
            for tag in model { tags.remove(tag) }
            #expect(tags.oldest == nil)
        }
    }

    @Test func settlingTheOldestMovesTheOldestOn() {
        var tags = UnsettledTags()
        for tag: UInt64 in 1...5 { tags.insert(tag) }
        tags.remove(3)
        #expect(tags.oldest == 1)
        tags.remove(1)
        #expect(tags.oldest == 2)
        tags.remove(2)
        #expect(tags.oldest == 4, "3 was settled before")
        tags.remove(4)
        tags.remove(5)
        #expect(tags.oldest == nil)
        tags.insert(9)
        #expect(tags.oldest == 9)
    }
}

@Suite struct DeliveryTagWindowTests {
    /// Against a dictionary, over random runs like those above: the same answers to every insert and remove, the
    /// same count and values after every step (the jobs under way are kept this way, by their delivery's tag).
    @Test func keepsWhatADictionaryWouldKeep() {
        var generator = Xorshift(state: 0xC0FFEE)
        for _ in 0..<100 {
            var window = DeliveryTagWindow<Int>()
            var model: [UInt64: Int] = [:]
            var next: UInt64 = 1
            for step in 0..<400 {
                let tag: UInt64
                switch Int.random(in: 0..<10, using: &generator) {
                case 0..<5:
                    next += UInt64.random(in: 0...2, using: &generator)
                    if Int.random(in: 0..<400, using: &generator) == 0 { next += 70_000 }
                    tag = next
                    next += 1
                    #expect(window.insert(step, for: tag) == (model.updateValue(step, forKey: tag) == nil))
                case 5:
                    tag = UInt64.random(in: 1...next, using: &generator)
                    #expect(window.insert(step, for: tag) == (model.updateValue(step, forKey: tag) == nil))
                default:
                    tag = model.keys.randomElement(using: &generator) ?? UInt64.random(in: 1...next, using: &generator)
                    #expect(window.remove(tag) == model.removeValue(forKey: tag))
                }
                #expect(window.count == model.count)
                #expect(window.oldest == model.keys.min())
            }
            #expect(window.values.sorted() == model.values.sorted())
        }
    }
}

/// Xorshift64*: the same runs every time.
private struct Xorshift: RandomNumberGenerator {
    var state: UInt64

    mutating func next() -> UInt64 {
        state ^= state >> 12
        state ^= state << 25
        state ^= state >> 27
        return state &* 0x2545_F491_4F6C_DD1D
    }
}
