import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A pipe another thread writes to so that a thread waiting in poll(2) wakes up; one byte per wake at most. The one
/// wake-up primitive of the programs: the worker's broker thread waits on it, and every `EventLoop` polls it
/// (Glibc's module map has no eventfd).
public final class Wakeup: Sendable {
    public let fileDescriptor: Int32
    private let writeEnd: Int32
    private let pending = Atomic<Bool>(false)

    public init() {
        var ends: [Int32] = [-1, -1]
        precondition(pipe(&ends) == 0, "pipe failed: the process is out of file descriptors")
        for end in ends {
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
        }
        fileDescriptor = ends[0]
        writeEnd = ends[1]
    }

    deinit {
        close(fileDescriptor)
        close(writeEnd)
    }

    public func signal() {
        guard !pending.exchange(true, ordering: .acquiringAndReleasing) else { return }
        var byte: UInt8 = 1
        _ = write(writeEnd, &byte, 1)
    }

    /// For a thread that polls `fileDescriptor` itself: empties the pipe once poll(2) saw it readable, so that the
    /// next `signal()` writes again.
    public func acknowledge() {
        var drain = (UInt64(0), UInt64(0))
        _ = read(fileDescriptor, &drain, 16)
        pending.store(false, ordering: .releasing)
    }

    /// Waits until the wake-up is signalled, `other` is readable, or `timeout` seconds pass.
    /// Returns true if `other` is readable.
    @discardableResult
    public func wait(alsoReadable other: Int32? = nil, timeout: Double) -> Bool {
        var fds = [pollfd(fd: fileDescriptor, events: Int16(POLLIN), revents: 0)]
        if let other { fds.append(pollfd(fd: other, events: Int16(POLLIN), revents: 0)) }
        _ = poll(&fds, nfds_t(fds.count), Int32(max(0, timeout) * 1000))
        if fds[0].revents != 0 { acknowledge() }
        return fds.count > 1 && fds[1].revents != 0
    }
}
