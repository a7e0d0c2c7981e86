import Testing

@testable import HTTP2

/// The allocator nghttp2 sessions use: blocks come back for reuse, contents survive a realloc, and what the pool
/// keeps is bounded.
@Suite struct MemoryPoolTests {
    @Test func aFreedBlockIsHandedOutAgainForTheSameSizeClass() throws {
        let pool = Nghttp2MemoryPool()
        let first = try #require(pool.allocate(100))
        pool.release(first)
        #expect(pool.cachedBlockCount == 1)
        let second = try #require(pool.allocate(120))  // 100 and 120 share the 128-byte class
        #expect(second == first)
        #expect(pool.cachedBlockCount == 0)
        let other = try #require(pool.allocate(20))  // a different class: a new block
        #expect(other != first)
        pool.release(second)
        pool.release(other)
    }

    @Test func reallocKeepsTheContentsAcrossClassesAndBeyondTheLargest() throws {
        let pool = Nghttp2MemoryPool()
        var block = try #require(pool.allocate(10))
        for index in 0..<10 { block.storeBytes(of: UInt8(index), toByteOffset: index, as: UInt8.self) }
        for size in [30, 500, 40_000, 100_000, 64] {
            block = try #require(pool.reallocate(block, size))
            let kept = (0..<10).map { block.load(fromByteOffset: $0, as: UInt8.self) }
            #expect(kept == Array(0..<10), "after realloc to \(size)")
            // The whole new size is usable (an overrun would be caught by the address sanitizer).
            block.storeBytes(of: 0xEE, toByteOffset: size - 1, as: UInt8.self)
        }
        pool.release(block)
    }

    @Test func callocZeroesAndRefusesAnOverflowingSize() throws {
        let pool = Nghttp2MemoryPool()
        let allocator = pool.nghttp2Allocator
        let dirty = try #require(pool.allocate(256))
        dirty.initializeMemory(as: UInt8.self, repeating: 0xAB, count: 256)
        pool.release(dirty)
        let clean = try #require(allocator.calloc(16, 16, allocator.mem_user_data))
        #expect(clean == dirty, "the freed block is reused")
        #expect((0..<256).allSatisfy { clean.load(fromByteOffset: $0, as: UInt8.self) == 0 })
        #expect(allocator.calloc(Int.max, 2, allocator.mem_user_data) == nil)
        allocator.free(clean, allocator.mem_user_data)
        allocator.free(nil, allocator.mem_user_data)  // free(NULL) is allowed, as in C
    }

    @Test func theCacheIsBoundedPerSizeClass() throws {
        let pool = Nghttp2MemoryPool()
        let blocks = (0..<(Nghttp2MemoryPool.maximumCachedBlocks + 100)).compactMap { _ in pool.allocate(48) }
        #expect(blocks.count == Nghttp2MemoryPool.maximumCachedBlocks + 100)
        for block in blocks { pool.release(block) }
        #expect(pool.cachedBlockCount == Nghttp2MemoryPool.maximumCachedBlocks)
    }
}
