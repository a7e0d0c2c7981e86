#if canImport(Glibc)
    import Glibc
#endif

/// A value guarded by a pthread mutex, used like Synchronization's `Mutex` (`withLock`).
///
/// Why not `Mutex`: on Linux it is built on futex calls in a module compiled without sanitizer instrumentation,
/// so ThreadSanitizer cannot see the ordering it provides and reports every guarded access as a race
/// (`scripts/sanitize thread`). A pthread mutex is intercepted by the sanitizers, costs the same uncontended, and
/// keeps their reports meaningful.
public final class Locked<Value>: @unchecked Sendable {
    // Invariant: `value` is only touched between lock and unlock of `mutex`.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private var value: Value

    public init(_ value: Value) {
        self.value = value
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    public func withLock<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure)
        -> Result
    {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
