#if canImport(Glibc)
    import Glibc
#endif

/// Threads that only ever do bulk work (the APNs client's bulk loop, the worker's job preparer) run at a lower
/// scheduling priority, nice +10: on a busy host the kernel then runs the threads urgent work passes through (the
/// broker thread, the urgent loop, the broker and Redis themselves) as soon as they wake, and bulk work takes the
/// time left, which on a host with cores to spare is all of it (docs/contract.md, "Lanes").
public enum BulkThread {
    public static let niceness: Int32 = 10

    /// Lowers the calling thread's priority (Linux keeps a nice value per thread; raising it back would need
    /// privileges, hence only for threads that do nothing else). A refusal leaves the thread as it was.
    public static func lowerCurrentThreadPriority() {
        _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, niceness)
    }
}
