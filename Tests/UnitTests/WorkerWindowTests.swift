import APNs
import Foundation
import Telemetry
import Testing
import Threads
import WorkerPipeline

/// A job's `local_window`: users outside their hours leave in a part that waits in the broker for their opening.
@Suite struct WorkerWindowTests {
    typealias Spec = WorkerTests

    /// A window of the two hours around now in UTC: a user in UTC is inside it, users six hours behind (their own
    /// zone, or the job's default zone) wait about five hours for it.
    static func windowedJob(_ id: String) -> (body: String, opening: Int64) {
        let now = Int(Date().timeIntervalSince1970)
        let minute = now / 60 % 1440
        let clock = { (minute: Int) in String(format: "%02d:%02d", (minute + 1440) % 1440 / 60, (minute + 1440) % 60) }
        let window = LocalWindow(start: (minute + 1440 - 60) % 1440, end: (minute + 60) % 1440)
        let opening = window.nextOpening(
            after: Date(timeIntervalSince1970: Double(now)), in: TimeZone(identifier: "Etc/GMT+6")!)
        let body =
            #"{"id":"\#(id)","topic":"\#(Spec.topic)","users":["inside","behind","zoneless"],"#
            + #""local_window":{"start":"\#(clock(minute - 60))","end":"\#(clock(minute + 60))"},"#
            + #""default_timezone":"Etc/GMT+6","payload":{"aps":{}}}"#
        return (body, opening)
    }

    static func prepare(_ fleet: InMemoryFleet) {
        fleet.change { state in
            state.cache = ["inside": Spec.cached(1), "behind": Spec.cached(2), "zoneless": Spec.cached(3)]
            state.timeZones = ["inside": "Etc/UTC", "behind": "Etc/GMT+6"]
        }
    }

    @Test func usersOutsideTheirHoursWaitInAPart() throws {
        let fleet = InMemoryFleet()
        Self.prepare(fleet)
        let running = Spec.Running(fleet, settings: Spec.settings())
        let (body, opening) = Self.windowedJob("windowed")
        let tag = fleet.deliver(body, properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "the job settled")
        running.stop()
        #expect(fleet.read(\.sent).map(\.token) == [Spec.token(1)], "only the user inside the window")
        let published = fleet.read(\.published)
        let part = try #require(
            published.first { if case .retry = $0.destination { true } else { false } }, "\(published)")
        let job = try PushJob.decode(part.body, defaultTopic: nil, fallbackID: "x")
        #expect(job.id == "windowed" && job.users == ["behind", "zoneless"] && job.sendAt == opening, "\(job)")
        let name = WindowSplit.Part(opensAt: opening, users: ["behind", "zoneless"], tokens: []).name
        #expect(part.properties.headers[Worker.windowPartHeader] == name && part.properties.replyTo == "replies")
        if case .retry(let delay, _) = part.destination {
            #expect(delay <= Double(opening) - Date().timeIntervalSince1970, "it waits no longer than its opening")
        }
        let summary = try #require(WorkerCancellationTests.summary(fleet))
        #expect(summary["delivered"] as? Int == 1 && summary["waiting_for_window"] as? Int == 2, "\(summary)")
    }

    /// A part published twice (its job's publications made again) starts once: the copy is acknowledged, nothing sent.
    @Test func aCopyOfAStartedPartSendsNothing() throws {
        let fleet = InMemoryFleet()
        Self.prepare(fleet)
        let running = Spec.Running(fleet, settings: Spec.settings())
        let due = Int64(Date().timeIntervalSince1970) - 1
        let part = WindowSplit.Part(opensAt: due, users: ["inside"], tokens: [])
        let body = try #require(
            WindowSplit.partBody(
                Array(Self.windowedJob("twice").body.utf8), users: part.users,
                tokens: [], sendAt: due))
        let properties = MessageProperties(headers: [Worker.windowPartHeader: part.name])
        let first = fleet.deliver(String(decoding: body, as: UTF8.self), properties: properties)
        #expect(fleet.wait { $0.acknowledged.contains(first) })
        let copy = fleet.deliver(String(decoding: body, as: UTF8.self), properties: properties)
        #expect(fleet.wait { $0.acknowledged.contains(copy) })
        running.stop()
        #expect(fleet.read(\.sent).map(\.token) == [Spec.token(1)], "sent once")
    }

    /// Cancelled before it settled, a windowed job publishes no part: what waited counts as cancelled.
    @Test func aCancelledWindowedJobLeavesNothingWaiting() throws {
        let fleet = InMemoryFleet()
        Self.prepare(fleet)
        fleet.change { $0.holdingAnswers = true }
        let running = Spec.Running(fleet, settings: Spec.settings())
        let tag = fleet.deliver(Self.windowedJob("called-off").body, properties: MessageProperties(replyTo: "replies"))
        #expect(fleet.wait { $0.sent.count == 1 }, "the user inside the window is being sent to")
        #expect(WorkerCancellationTests.cancel("called-off", in: fleet), "the worker read the cancellations again")
        fleet.releaseAnswers()
        #expect(fleet.wait { $0.acknowledged.contains(tag) }, "the job settled")
        running.stop()
        #expect(fleet.read { $0.published.map(\.destination) } == [.reply("replies")], "no part waits")
        let summary = try #require(WorkerCancellationTests.summary(fleet))
        #expect(summary["cancelled"] as? Int == 2 && summary["waiting_for_window"] as? Int == 0, "\(summary)")
    }
}
