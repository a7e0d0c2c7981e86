import Foundation
import Testing
import WorkerPipeline

/// The reconnect back-off keeps growing while a failure recurs right after reconnecting.
@Suite struct ReconnectBackoffTests {
    @Test func failuresRightAfterConnectingKeepTheCountGrowing() {
        var backoff = ReconnectBackoff(stableAfter: 30)
        let start = Date(timeIntervalSince1970: 1_000)
        for attempt in 1...8 {
            backoff.connected(at: start.addingTimeInterval(Double(attempt)))
            _ = backoff.failed(at: start.addingTimeInterval(Double(attempt) + 0.2))
        }
        #expect(backoff.failures == 8)
        // 0.25 s doubling, capped at 30 s, jittered between half and all of it.
        #expect(reconnectDelay(afterFailures: 8) >= 15)
    }

    @Test func aSessionThatStayedUpStartsTheCountOver() {
        var backoff = ReconnectBackoff(stableAfter: 30)
        let start = Date(timeIntervalSince1970: 1_000)
        _ = backoff.failed(at: start)
        _ = backoff.failed(at: start.addingTimeInterval(1))
        backoff.connected(at: start.addingTimeInterval(2))
        let delay = backoff.failed(at: start.addingTimeInterval(100))
        #expect(backoff.failures == 1)
        #expect(delay <= 0.25)
    }
}
