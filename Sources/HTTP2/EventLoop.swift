import Foundation
import Synchronization
import TLS
import Telemetry
import Threads

#if canImport(Glibc)
    import Glibc
#endif

/// Something with a file descriptor that an `EventLoop` polls and wakes.
/// All methods are called on the loop's own thread.
public protocol PollHandler: AnyObject {
    var fileDescriptor: Int32 { get }
    /// POLLIN / POLLOUT as the handler needs them right now.
    var pollEvents: Int16 { get }
    func handlePollEvents(_ events: Int16)
}

/// One thread waiting in poll(2) on its handlers' sockets plus a `Wakeup` that other threads signal.
/// Work crosses into the loop in batches through `execute`, never by sharing the handlers' C state.
public final class EventLoop: @unchecked Sendable {
    // Invariant: `handlers`, `timers`, `nextTimerID` are touched only on the loop thread;
    // `pending` is the one cross-thread door, guarded by its Mutex and announced through `wakeup`.
    private let name: String
    private let wakeup = Wakeup()
    private let pending = Locked<[@Sendable () -> Void]>([])
    private let running = Atomic<Bool>(true)
    private var handlers: [PollHandler] = []
    private var timers: [(id: UInt64, deadline: UInt64, action: () -> Void)] = []
    private var nextTimerID: UInt64 = 1
    private let threadID = Atomic<UInt>(0)
    private let finished = DispatchSemaphore(value: 0)

    /// OpenSSL writes to sockets with write(2), which raises SIGPIPE when the peer has gone; the error code is
    /// what we act on, so the signal must not kill the process. Done once, on the first loop made.
    private static let ignoreBrokenPipes: Void = { _ = signal(SIGPIPE, SIG_IGN) }()

    /// `bulkWork`: the loop's thread only ever does bulk work, and runs at `BulkThread`'s lower priority.
    public init(name: String, bulkWork: Bool = false) {
        _ = Self.ignoreBrokenPipes
        self.name = name
        let thread = Thread { [self] in
            if bulkWork { BulkThread.lowerCurrentThreadPriority() }
            self.run()
        }
        thread.name = name
        thread.start()
    }

    public var inEventLoop: Bool { threadID.load(ordering: .acquiring) == UInt(pthread_self()) }

    /// Runs `task` on the loop thread, after whatever is already queued.
    public func execute(_ task: @escaping @Sendable () -> Void) {
        pending.withLock { $0.append(task) }
        wake()
    }

    /// Stops the loop after the tasks queued so far; waits for its thread to end unless called from it.
    public func shutdown() {
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return }
        wake()
        if !inEventLoop { finished.wait() }
    }

    // MARK: loop-thread API

    public func register(_ handler: PollHandler) {
        assert(inEventLoop)
        handlers.append(handler)
    }

    public func deregister(_ handler: PollHandler) {
        assert(inEventLoop)
        handlers.removeAll { $0 === handler }
    }

    /// Runs `action` on the loop thread after `delay` seconds, unless cancelled first.
    @discardableResult
    public func schedule(after delay: Double, _ action: @escaping () -> Void) -> UInt64 {
        assert(inEventLoop)
        let id = nextTimerID
        nextTimerID += 1
        timers.append((id, Self.now() + UInt64(max(0, delay) * 1e9), action))
        return id
    }

    public func cancelTimer(_ id: UInt64) {
        assert(inEventLoop)
        timers.removeAll { $0.id == id }
    }

    public static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    // MARK: the loop

    private func wake() { wakeup.signal() }

    private func run() {
        threadID.store(UInt(pthread_self()), ordering: .releasing)
        var fds: [pollfd] = []
        while true {
            runPendingTasks()
            runDueTimers()
            if !running.load(ordering: .acquiring) { break }
            fds.removeAll(keepingCapacity: true)
            fds.append(pollfd(fd: wakeup.fileDescriptor, events: Int16(POLLIN), revents: 0))
            let polled = handlers
            for handler in polled {
                fds.append(pollfd(fd: handler.fileDescriptor, events: handler.pollEvents, revents: 0))
            }
            let ready = poll(&fds, nfds_t(fds.count), pollTimeoutMilliseconds())
            if ready < 0 { continue }  // EINTR
            if fds[0].revents != 0 { wakeup.acknowledge() }
            for (index, handler) in polled.enumerated() where fds[index + 1].revents != 0 {
                // A handler removed by an earlier one in this round is not called again.
                guard handlers.contains(where: { $0 === handler }) else { continue }
                handler.handlePollEvents(fds[index + 1].revents)
            }
        }
        runPendingTasks()
        threadID.store(0, ordering: .releasing)
        finished.signal()
    }

    private func runPendingTasks() {
        let tasks = pending.withLock { tasks -> [@Sendable () -> Void] in
            let taken = tasks
            tasks.removeAll(keepingCapacity: true)
            return taken
        }
        for task in tasks { task() }
    }

    private func runDueTimers() {
        let now = Self.now()
        // Checked first so that the common turn, with nothing due, allocates nothing.
        guard timers.contains(where: { $0.deadline <= now }) else { return }
        let due = timers.filter { $0.deadline <= now }
        timers.removeAll { $0.deadline <= now }
        for timer in due { timer.action() }
    }

    private func pollTimeoutMilliseconds() -> Int32 {
        guard let nearest = timers.lazy.map(\.deadline).min() else { return -1 }
        let now = Self.now()
        if nearest <= now { return 0 }
        return Int32(min((nearest - now + 999_999) / 1_000_000, 60_000))
    }
}
