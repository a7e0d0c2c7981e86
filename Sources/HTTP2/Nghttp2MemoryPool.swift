internal import CNghttp2

#if canImport(Glibc)
    import Glibc
#endif

/// The allocator one nghttp2 session uses: freed blocks are kept on per-size free lists and handed out again.
///
/// Why: nghttp2 makes about eight allocations per request (stream, outbound item, the copied header fields, the
/// received fields' buffers) and frees them when the stream closes. With a thousand streams in flight they come
/// and go in bursts far larger than glibc's per-thread cache of seven blocks per size, so most went through
/// malloc's slow path.
///
/// A block carries a 16-byte header with its size class. Classes are powers of two from 32 bytes to 16 KiB; larger
/// blocks go straight to malloc. Each free list keeps at most `maximumCachedBlocks`, so what the pool holds is
/// bounded by the connection's busiest moment, and all of it is returned when the session is deleted.
///
/// Not thread-safe, and need not be: a session and its pool belong to one connection, used on its loop thread.
final class Nghttp2MemoryPool {
    private static let headerSize = 16
    private static let smallestClassShift = 5  // 32 bytes
    private static let classCount = 10  // 32 B ... 16 KiB
    private static let uncachedClass: UInt64 = .max
    static let maximumCachedBlocks = 4096

    // Plain buffers rather than arrays: no uniqueness check or bounds check on a path taken 16 times per request.
    private let freeLists: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    private let cachedCounts: UnsafeMutablePointer<Int>

    init() {
        freeLists = .allocate(capacity: Self.classCount)
        freeLists.initialize(repeating: nil, count: Self.classCount)
        cachedCounts = .allocate(capacity: Self.classCount)
        cachedCounts.initialize(repeating: 0, count: Self.classCount)
    }

    deinit {
        for sizeClass in 0..<Self.classCount {
            var block = freeLists[sizeClass]
            while let current = block {
                block = current.load(as: UnsafeMutableRawPointer?.self)
                free(current - Self.headerSize)
            }
        }
        freeLists.deallocate()
        cachedCounts.deallocate()
    }

    /// The nghttp2_mem to give nghttp2_session_*_new3. The pool must outlive the session.
    var nghttp2Allocator: nghttp2_mem {
        // _withUnsafeGuaranteedRef: the session never outlives the pool, and a retain and release per call would cost
        // more than the allocation itself.
        nghttp2_mem(
            mem_user_data: Unmanaged.passUnretained(self).toOpaque(),
            malloc: { size, user in Nghttp2MemoryPool.with(user) { $0.allocate(size) } },
            free: { pointer, user in Nghttp2MemoryPool.with(user) { $0.release(pointer) } },
            calloc: { count, size, user in
                let (total, overflow) = count.multipliedReportingOverflow(by: size)
                guard !overflow, let block = Nghttp2MemoryPool.with(user, { $0.allocate(total) }) else { return nil }
                memset(block, 0, total)
                return block
            },
            realloc: { pointer, size, user in Nghttp2MemoryPool.with(user) { $0.reallocate(pointer, size) } })
    }

    private static func with<Result>(_ user: UnsafeMutableRawPointer?, _ body: (Nghttp2MemoryPool) -> Result) -> Result
    {
        Unmanaged<Nghttp2MemoryPool>.fromOpaque(user!)._withUnsafeGuaranteedRef(body)
    }

    /// The class whose blocks hold `size` bytes, or nil for sizes above the largest class.
    private static func sizeClass(for size: Int) -> Int? {
        let needed = max(size, 1 << smallestClassShift)
        let shift = Int.bitWidth - (needed - 1).leadingZeroBitCount
        let index = shift - smallestClassShift
        return index < classCount ? index : nil
    }

    private static func capacity(ofClass sizeClass: Int) -> Int { 1 << (sizeClass + smallestClassShift) }

    func allocate(_ size: Int) -> UnsafeMutableRawPointer? {
        guard let sizeClass = Self.sizeClass(for: size) else {
            guard let raw = malloc(size + Self.headerSize) else { return nil }
            raw.storeBytes(of: Self.uncachedClass, as: UInt64.self)
            raw.storeBytes(of: UInt64(size), toByteOffset: 8, as: UInt64.self)
            return raw + Self.headerSize
        }
        if let block = freeLists[sizeClass] {
            freeLists[sizeClass] = block.load(as: UnsafeMutableRawPointer?.self)
            cachedCounts[sizeClass] -= 1
            return block
        }
        guard let raw = malloc(Self.capacity(ofClass: sizeClass) + Self.headerSize) else { return nil }
        raw.storeBytes(of: UInt64(sizeClass), as: UInt64.self)
        return raw + Self.headerSize
    }

    func release(_ pointer: UnsafeMutableRawPointer?) {
        guard let pointer else { return }
        let raw = pointer - Self.headerSize
        let tag = raw.load(as: UInt64.self)
        guard tag != Self.uncachedClass, cachedCounts[Int(tag)] < Self.maximumCachedBlocks else {
            free(raw)
            return
        }
        let sizeClass = Int(tag)
        pointer.storeBytes(of: freeLists[sizeClass], as: UnsafeMutableRawPointer?.self)
        freeLists[sizeClass] = pointer
        cachedCounts[sizeClass] += 1
    }

    func reallocate(_ pointer: UnsafeMutableRawPointer?, _ size: Int) -> UnsafeMutableRawPointer? {
        guard let pointer else { return allocate(size) }
        let raw = pointer - Self.headerSize
        let tag = raw.load(as: UInt64.self)
        let usable =
            tag == Self.uncachedClass
            ? Int(raw.load(fromByteOffset: 8, as: UInt64.self))
            : Self.capacity(ofClass: Int(tag))
        if size <= usable && tag != Self.uncachedClass { return pointer }
        guard let moved = allocate(size) else { return nil }
        memcpy(moved, pointer, min(usable, size))
        release(pointer)
        return moved
    }

    /// Blocks kept for reuse, by class (tests).
    var cachedBlockCount: Int { (0..<Self.classCount).reduce(0) { $0 + cachedCounts[$1] } }
}
