import APNs
import Foundation
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// Suspects (jobs that came back twice unsettled) over whole jobs.
@Suite struct WorkerSuspectTests {
    typealias Spec = WorkerTests

    @Test func aBulkSuspectRunsAloneWhileUrgentJobsKeepFlowing() throws {
        let fleet = InMemoryFleet()
        fleet.change { state in
            state.holdingAnswers = true
            // Its third delivery, and the worker that last ran it died with it (its running mark is still there).
            state.running.insert("id:campaign")
        }
        let running = Spec.Running(fleet)
        let suspect = fleet.deliver(
            Spec.job("campaign", tokens: [Spec.token(1)]), lane: .bulk,
            properties: MessageProperties(messageID: "campaign", deliveryCount: 2), redelivered: true)
        #expect(fleet.wait { $0.startedAlone == ["id:campaign"] && $0.sent.count == 1 }, "the suspect runs alone")
        let bulk = fleet.deliver(Spec.job("next-campaign", tokens: [Spec.token(2)]), lane: .bulk)
        let urgent = fleet.deliver(Spec.job("urgent", tokens: [Spec.token(3)]))
        #expect(fleet.wait { $0.sent.contains { $0.token == Spec.token(3) } }, "the urgent job went out meanwhile")
        #expect(!fleet.read { $0.sent.contains { $0.token == Spec.token(2) } }, "the other bulk job waits behind it")
        fleet.releaseAnswers()
        #expect(fleet.wait { Set($0.acknowledged) == [suspect, bulk, urgent] })
        running.stop()
        #expect(fleet.read(\.alone).isEmpty, "its mark went once it settled")
    }

    /// A third delivery that no worker died running (its earlier deliveries were lost in transit with a connection,
    /// or handed back) runs as usual; once started it carries a running mark until it settles.
    @Test func deliveriesNoWorkerDiedRunningMakeNoSuspect() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = Spec.Running(fleet)
        let tag = fleet.deliver(
            Spec.job("lost-twice", tokens: [Spec.token(1)]),
            properties: MessageProperties(messageID: "lost-twice", deliveryCount: 2), redelivered: true)
        #expect(
            fleet.wait { $0.sent.count == 1 && $0.running == ["id:lost-twice"] }, "sent at once, marked while it runs")
        fleet.releaseAnswers()
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(fleet.read(\.startedAlone).isEmpty, "not run alone")
        #expect(fleet.read(\.running).isEmpty, "its mark went once it settled")
    }

    @Test func deliveriesGivenBackByAnOrderlyStopMakeNoSuspect() throws {
        let fleet = InMemoryFleet()
        // Third delivery, but two rolling restarts gave it back: it is an ordinary job.
        fleet.change { $0.givenBack["id:restarted"] = 2 }
        let running = Spec.Running(fleet)
        let tag = fleet.deliver(
            Spec.job("restarted", tokens: [Spec.token(1)]),
            properties: MessageProperties(messageID: "restarted", deliveryCount: 2), redelivered: true)
        #expect(fleet.wait { $0.acknowledged.contains(tag) })
        running.stop()
        #expect(fleet.read(\.startedAlone).isEmpty, "not run alone")
    }

    @Test func aStopNotesWhatItGivesBack() throws {
        let fleet = InMemoryFleet()
        fleet.change { $0.holdingAnswers = true }
        let running = Spec.Running(fleet, settings: Spec.settings(maximumInFlight: 5, bulkJobsPerTurn: 1))
        let tags = (1...2).map { job in
            fleet.deliver(
                Spec.job("given-\(job)", tokens: (1...20).map { Spec.token(job * 100 + $0) }), lane: .bulk,
                properties: MessageProperties(messageID: "given-\(job)"))
        }
        #expect(fleet.wait { $0.sent.count == 5 && $0.ready.isEmpty })
        running.worker.stop()
        #expect(fleet.wait { $0.requeued == [tags[1]] })
        #expect(fleet.read(\.givenBack) == ["id:given-2": 1], "the unstarted job is noted as given back")
        fleet.releaseAnswers()
        running.stop()
    }
}
