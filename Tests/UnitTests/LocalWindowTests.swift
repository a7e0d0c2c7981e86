import APNs
import Foundation
import RedisStore
import Telemetry
import Testing
import WorkerPipeline

/// A job's `local_window`: its hours in each user's day, the next opening by the time zone database (daylight-saving
/// changes included), the job's checks, and the parts that wait.
@Suite struct LocalWindowTests {
    let logger = Logger(label: "window", level: .critical)

    func decode(_ text: String) throws(JobError) -> PushJob {
        try PushJob.decode(Array(text.utf8), defaultTopic: "com.example.app", fallbackID: "fallback")
    }

    /// UNIX seconds of a UTC date and time.
    func utc(_ year: Int, _ month: Int, _ day: Int, _ hour: Int, _ minute: Int = 0) -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar.date(from: DateComponents(year: year, month: month, day: day, hour: hour, minute: minute))!
    }

    func zone(_ name: String) -> TimeZone { TimeZone(identifier: name)! }

    @Test func aWindowThatCrossesMidnightHoldsBothEnds() {
        let night = LocalWindow(start: 22 * 60, end: 6 * 60)
        #expect(
            night.contains(minuteOfDay: 23 * 60 + 30) && night.contains(minuteOfDay: 0)
                && night.contains(minuteOfDay: 359))
        #expect(
            !night.contains(minuteOfDay: 6 * 60) && !night.contains(minuteOfDay: 12 * 60)
                && !night.contains(minuteOfDay: 21 * 60 + 59))
        let day = LocalWindow(start: 9 * 60, end: 21 * 60)
        #expect(
            day.contains(minuteOfDay: 9 * 60) && !day.contains(minuteOfDay: 21 * 60)
                && !day.contains(minuteOfDay: 8 * 60 + 59))
    }

    @Test func localTimeFollowsTheUsersZone() {
        let window = LocalWindow(start: 9 * 60, end: 21 * 60)
        let now = utc(2026, 12, 4, 23)  // 08:00 in Tokyo, 18:00 in New York, 09:00 in Brisbane
        #expect(!window.contains(now, in: zone("Asia/Tokyo")))
        #expect(window.contains(now, in: zone("America/New_York")))
        #expect(window.contains(now, in: zone("Australia/Brisbane")))
        #expect(
            window.nextOpening(after: now, in: zone("Asia/Tokyo")) == Int64(utc(2026, 12, 5, 0).timeIntervalSince1970))
        #expect(
            window.nextOpening(after: now, in: zone("America/New_York"))
                == Int64(utc(2026, 12, 5, 14).timeIntervalSince1970), "09:00 EST the next morning")
    }

    @Test func openingsFollowDaylightSavingChanges() {
        // Paris moves to summer time in the night of 28 to 29 March 2026: 09:00 on the 29th is 07:00 UTC, not 08:00.
        let morning = LocalWindow(start: 9 * 60, end: 12 * 60)
        #expect(
            morning.nextOpening(after: utc(2026, 3, 28, 12), in: zone("Europe/Paris"))
                == Int64(utc(2026, 3, 29, 7).timeIntervalSince1970))
        // New York skips 02:00-03:00 on 8 March 2026: a window that starts at 02:30 opens at 03:00 EDT (07:00 UTC).
        let skipped = LocalWindow(start: 2 * 60 + 30, end: 5 * 60)
        #expect(
            skipped.nextOpening(after: utc(2026, 3, 8, 5), in: zone("America/New_York"))
                == Int64(utc(2026, 3, 8, 7).timeIntervalSince1970))
        // 01:30 happens twice on 1 November 2026: the window opens at the first (EDT, 05:30 UTC).
        let repeated = LocalWindow(start: 60 + 30, end: 4 * 60)
        #expect(
            repeated.nextOpening(after: utc(2026, 11, 1, 4), in: zone("America/New_York"))
                == Int64(utc(2026, 11, 1, 5, 30).timeIntervalSince1970))
    }

    /// A change of offset off the hour, at midnight, or a second away, and when the window opens around it.
    struct Change: Sendable, CustomStringConvertible {
        var zone: String
        var start: Int
        var after: Double
        var opens: Int64
        var description: String
    }

    /// Zones whose changes are not on the hour, or at midnight: the opening is that day's, never the next day's.
    /// Expected instants worked out independently (Python's zoneinfo on the same time zone database).
    @Test(arguments: [
        Change(
            zone: "Australia/Lord_Howe", start: 2 * 60, after: 1_759_581_000, opens: 1_759_591_800,
            description: "02:00 jumps to 02:30 on 5 October 2025: a window from 02:00 opens at 02:30"),
        Change(
            zone: "Pacific/Chatham", start: 3 * 60 + 45, after: 1_743_850_800, opens: 1_743_865_200,
            description: "03:45 goes back to 02:45 on 6 April 2025: 03:45 comes once, an hour after the change"),
        Change(
            zone: "Pacific/Chatham", start: 3 * 60, after: 1_758_971_700, opens: 1_758_981_600,
            description: "02:45 jumps to 03:45 on 28 September 2025: a window from 03:00 opens at 03:45"),
        Change(
            zone: "America/New_York", start: 2 * 60 + 30, after: 1_741_503_599.5, opens: 1_741_503_600,
            description: "half a second before 02:00 jumps to 03:00 on 9 March 2025: 02:30 opens as it jumps"),
        Change(
            zone: "America/Nuuk", start: 23 * 60, after: 1_743_285_600, opens: 1_743_296_400,
            description: "23:00 jumps to midnight on 29 March 2025: a window from 23:00 opens at midnight")
    ])
    func openingsAroundChangesOffTheHourAreThatDays(_ change: Change) {
        let window = LocalWindow(start: change.start, end: (change.start + 4 * 60) % (24 * 60))
        #expect(
            window.nextOpening(after: Date(timeIntervalSince1970: change.after), in: zone(change.zone)) == change.opens)
    }

    @Test func aJobsWindowIsCheckedAsItIsDecoded() throws {
        let window = try #require(
            try decode(
                #"""
                {"users": ["u1"], "local_window": {"start": "21:30", "end": "07:00"}, "default_timezone": "Europe/Paris",
                 "payload": {"aps": {}}}
                """#
            ).localWindow)
        #expect(window == LocalWindow(start: 21 * 60 + 30, end: 7 * 60, defaultZone: "Europe/Paris"))
        #expect(
            try decode(
                #"{"users": ["u1"], "local_window": {"start": "09:00", "end": "21:00"}, "payload": {"aps": {}}}"#
            )
            .localWindow?.defaultZone == "UTC")
        let refused: [(String, String)] = [
            (#""local_window": {"start": "9:00", "end": "21:00"}"#, "local_window.start"),
            (#""local_window": {"start": "09:00", "end": "24:00"}"#, "local_window.end"),
            (#""local_window": {"start": "09:00", "end": "09:00"}"#, "at least a minute"),
            (#""local_window": {"start": "09:00"}"#, "local_window.end"),
            (#""local_window": {"start": "09:00", "end": "21:00", "days": 5}"#, "unknown member \"days\""),
            (#""local_window": "09:00-21:00""#, "local_window"),
            (
                #""local_window": {"start": "09:00", "end": "21:00"}, "default_timezone": "Mars/Olympus_Mons""#,
                "Mars/Olympus_Mons"
            ),
            (
                #""local_window": {"start": "09:00", "end": "21:00"}, "default_timezone": "../../etc/passwd""#,
                "not an IANA"
            ),
            (#""default_timezone": "Europe/Paris""#, "goes with a \"local_window\"")
        ]
        for (members, named) in refused {
            #expect(throws: JobError.self, "\(members)") {
                do { _ = try decode(#"{"users": ["u1"], \#(members), "payload": {"aps": {}}}"#) } catch {
                    #expect(String(describing: error).contains(named), "\(members): \(error)")
                    throw error
                }
            }
        }
        #expect(throws: JobError.self, "a broadcast has no users' hours") {
            try decode(
                #"""
                {"channel_id": "dHN0LTEyMzQ1Njc4OTAxMg==", "push_type": "liveactivity", "local_window": {"start": "09:00", "end": "21:00"},
                 "live_activity": {"event": "update", "timestamp": 1, "content_state": {}}}
                """#)
        }
    }

    @Test func timeZoneNamesAreTheDatabases() {
        #expect(
            TimeZoneName.problem("Europe/Paris") == nil && TimeZoneName.problem("America/Argentina/Buenos_Aires") == nil
        )
        for name in [
            "", "Nowhere/City", "europe/paris", "../etc/passwd", "/etc/localtime", "Europe", "GMT+0500", "Europe/-x"
        ] {
            #expect(TimeZoneName.problem(name) != nil, "\(name)")
        }
    }

    @Test func aRegistrationCarriesItsUsersZone() throws {
        let token = String(repeating: "ab", count: 32)
        let event = try RegistrationEvent.decode(
            Array(#"{"user": "u1", "token": "\#(token)", "timezone": "Asia/Tokyo"}"#.utf8), now: 1_796_184_000_000)
        #expect(event.registration.timeZone == "Asia/Tokyo")
        #expect(
            try RegistrationEvent.decode(event.json, now: 1_796_184_000_000) == event,
            "the zone survives the event's JSON")
        // A zone this system does not know costs the user the zone, never the token.
        let unknown = try RegistrationEvent.decode(
            Array(#"{"user": "u1", "token": "\#(token)", "timezone": "Tokio"}"#.utf8), now: 1_796_184_000_000)
        #expect(unknown.registration.token == token && unknown.registration.timeZone == nil)
        #expect(
            unknown.ignoredTimeZone == "Tokio"
                && unknown.timeZoneProblem?.contains("not in the system's time zone database") == true)
        #expect(try RegistrationEvent.decode(unknown.json, now: 1_796_184_000_000) == unknown)
    }

    @Test func usersOutsideTheirHoursWaitByOpeningAndThoseAfterTheDeadlineExpire() throws {
        let now = utc(2026, 12, 4, 23)  // 08:00 in Tokyo and Seoul, 18:00 in New York
        let token = String(repeating: "cd", count: 32)
        let job = try decode(
            #"""
            {"id": "j", "users": ["tokyo", "seoul", "new-york", "none", "late"], "tokens": ["\#(token)"],
             "local_window": {"start": "09:00", "end": "21:00"}, "default_timezone": "America/New_York",
             "deadline": \#(Int64(now.timeIntervalSince1970) + 7200), "payload": {"aps": {}}}
            """#)
        let zones = [
            "tokyo": "Asia/Tokyo", "seoul": "Asia/Seoul", "new-york": "America/New_York", "late": "Europe/Paris"
        ]
        let split = WindowSplit(job, window: try #require(job.localWindow), zones: zones, now: now, logger: logger)
        #expect(split.users == ["new-york", "none"] && split.tokens == [token], "inside their hours: sent now")
        let opening = Int64(utc(2026, 12, 5, 0).timeIntervalSince1970)
        #expect(split.parts == [WindowSplit.Part(opensAt: opening, users: ["tokyo", "seoul"], tokens: [])])
        #expect(split.expired == 1, "Paris opens at 08:00 UTC, after the deadline")
        #expect(split.waiting == 2 && !split.isWhole)
        // A deadline at the very opening: nothing could go before it, and nothing waits for it.
        let atOpening = try decode(
            #"{"id": "k", "users": ["tokyo"], "local_window": {"start": "09:00", "end": "21:00"}, "deadline": \#(opening), "payload": {"aps": {}}}"#
        )
        let expiredAtOnce = WindowSplit(
            atOpening, window: try #require(atOpening.localWindow), zones: zones, now: now, logger: logger)
        #expect(expiredAtOnce.expired == 1 && expiredAtOnce.parts.isEmpty)
    }

    @Test func aPartIsTheJobWithItsUsersAndItsOpening() throws {
        let token = String(repeating: "ef", count: 32)
        let original = #"""
            { "id": "j", "users": ["a", "b", "c"], "tokens": ["\#(token)"], "payload": {"aps": {"alert": "héllo"}},
              "local_window": {"start": "09:00", "end": "21:00"}}
            """#
        let sendAt = Int64(Date().timeIntervalSince1970) + 3600
        let part = try #require(WindowSplit.partBody(Array(original.utf8), users: ["b"], tokens: [], sendAt: sendAt))
        let job = try PushJob.decode(part, defaultTopic: "com.example.app", fallbackID: "x")
        #expect(job.id == "j" && job.users == ["b"] && job.tokens.isEmpty && job.sendAt == sendAt)
        #expect(job.localWindow == LocalWindow(start: 9 * 60, end: 21 * 60), "checked against the window again")
        #expect(String(decoding: job.payload, as: UTF8.self) == #"{"aps": {"alert": "héllo"}}"#)
        // A part of a part replaces its send_at rather than adding a second one.
        let again = try #require(WindowSplit.partBody(part, users: ["b"], tokens: [], sendAt: sendAt + 60))
        #expect(try PushJob.decode(again, defaultTopic: "com.example.app", fallbackID: "x").sendAt == sendAt + 60)
    }

    @Test func aJobWithPartsWaitingIsNotDone() {
        let fields = [
            "first_update": "1000", "last_update": "3000", "ended": "3000", "sent": "2", "waiting_for_window": "1"
        ]
        let report = JobProgressReport(jobID: "j", fields: fields, cancelled: false)
        #expect(report.state == .running && report.counts["waiting_for_window"] == 1 && report.etaSeconds == nil)
        var done = fields
        done["waiting_for_window"] = "0"
        #expect(JobProgressReport(jobID: "j", fields: done, cancelled: false).state == .done)
        var waitingOnly = fields
        waitingOnly["sent"] = "0"
        #expect(JobProgressReport(jobID: "j", fields: waitingOnly, cancelled: false).state == .scheduled)
    }
}
