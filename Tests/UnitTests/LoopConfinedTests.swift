import Foundation
import Testing

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
}
