import APNs
import Foundation
import Telemetry
import Testing
import Threads

@testable import WorkerPipeline

/// A value confined to one thread checks, in debug builds (the tests'), that no other thread touches it.
@Suite struct LoopConfinedTests {
    @Test func itsOwnThreadReadsAndWritesIt() {
        let owner = UInt(pthread_self())
        let confined = LoopConfined((jobs: [Int](), scheduled: false)) { UInt(pthread_self()) == owner }
        confined.value.jobs.append(1)
        confined.value.scheduled = true
        #expect(confined.value.jobs == [1] && confined.value.scheduled)
    }

    @Test func anotherThreadTouchingItStopsTheProcess() async {
        await #expect(processExitsWith: .failure) {
            let owner = UInt(pthread_self())
            let confined = LoopConfined(0) { UInt(pthread_self()) == owner }
            confined.value += 1
            let done = DispatchSemaphore(value: 0)
            let other = Thread {
                confined.value += 1
                done.signal()
            }
            other.start()
            done.wait()
        }
    }

    /// A job's outcome recorded anywhere but its lane's sender thread stops the process too: the collector asks the
    /// sender, whose lanes here are serial queues.
    @Test func anOutcomeRecordedOffItsLanesThreadStopsTheProcess() async {
        await #expect(processExitsWith: .failure) {
            let sender = InMemorySender(InMemoryFleet())
            let collector = AnswerCollector(
                statistics: WorkerStatistics(), logger: Logger(label: "test", level: .critical),
                sender: sender, wakeup: Wakeup())
            let job = try! PushJob.decode(
                Array(#"{"tokens": ["\#(String(repeating: "ab", count: 32))"], "payload": {}}"#.utf8),
                defaultTopic: "com.example.app", fallbackID: "j")
            let delivery = JobDelivery(tag: 1, redelivered: false, body: [], properties: MessageProperties())
            let target = DeviceTarget(token: String(repeating: "ab", count: 32), environment: .production, user: nil)
            let progress = JobProgress(
                job: job, delivery: delivery, generation: 1, targets: [target], hasStableID: true)
            collector.record(APNsResult(outcome: .delivered, response: APNsResponse(status: 200)), for: progress, 0)
        }
    }
}
