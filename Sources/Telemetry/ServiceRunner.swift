import Foundation
import Threads

#if canImport(Glibc)
    import Glibc
#endif

/// The one way the programs run a long-lived `Service` and take their signals (the worker, the cleanup consumer,
/// apns-sim).
///
/// SIGINT, SIGTERM and SIGHUP are blocked in every thread from the first instruction of such a program (threads
/// inherit the mask), so a signal arriving at any moment, start-up included, stays pending until the runner takes it
/// with sigwait: never lost, never the default action that kills mid-work. SIGHUP asks the service to `reload()`.
public enum ServiceRunner {
    /// Call first thing in `main`, before any thread exists.
    public static func blockServiceSignals() {
        var signals = serviceSignals
        pthread_sigmask(SIG_BLOCK, &signals, nil)
    }

    private static var serviceSignals: sigset_t {
        var signals = sigset_t()
        sigemptyset(&signals)
        sigaddset(&signals, SIGINT)
        sigaddset(&signals, SIGTERM)
        sigaddset(&signals, SIGHUP)
        return signals
    }

    /// Runs `service` on a thread of its own until `run()` returns. The first SIGINT or SIGTERM calls `stop()`; a
    /// second exits at once with `interruptedExitCode` (unfinished work returns to the broker). Each SIGHUP calls
    /// `reload()`, whose failure is logged and changes nothing. Returns what `run()` threw, if anything.
    public static func run(
        _ service: any Service, name: String, logger: Logger,
        interruptedExitCode: Int32 = 1
    ) -> (any Error)? {
        let waiter = Thread {
            var signals = serviceSignals
            var received: Int32 = 0
            var count = 0
            while sigwait(&signals, &received) == 0 {
                if received == SIGHUP {
                    // On this thread: a reload reads files and opens nothing itself, and signals wait meanwhile.
                    logger.info("SIGHUP received: reloading")
                    do { try service.reload() } catch {
                        logger.error("reload failed: carrying on with what was loaded before", ["error": "\(error)"])
                    }
                    continue
                }
                count += 1
                if count > 1 {
                    logger.warning("second signal: exiting now; unfinished work returns to the queue")
                    // _exit, not exit: no atexit handlers that could wait on the threads still working.
                    _exit(interruptedExitCode)
                }
                logger.info("signal received: stopping", ["signal": String(received)])
                service.stop()
            }
        }
        waiter.name = "signals"
        waiter.start()
        let finished = DispatchSemaphore(value: 0)
        let failure = Locked<(any Error)?>(nil)
        let thread = Thread {
            do { try service.run() } catch { failure.withLock { $0 = error } }
            finished.signal()
        }
        thread.name = name
        thread.start()
        finished.wait()
        return failure.withLock { $0 }
    }
}
