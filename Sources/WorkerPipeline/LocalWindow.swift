import APNsModel
import Foundation
import JSON
import Telemetry
import Threads

/// A job's `local_window`: the hours of each user's own day in which its notifications may go out, as local wall
/// time (`"09:00"` to `"21:00"`, the end excluded; a start after the end crosses midnight). Users' time zones come
/// from their registrations (`TimeZoneName`); a user without one, and the job's direct tokens, take the job's
/// `default_timezone`, else UTC. Local time follows the system's time zone database, daylight-saving changes
/// included: an opening that falls in a skipped hour opens at the first minute after it.
public struct LocalWindow: Sendable, Equatable {
    /// Minutes after local midnight.
    public let start: Int
    public let end: Int
    /// The zone of users without one of their own (and of the job's direct tokens).
    public let defaultZone: String

    static let minutesPerDay = 24 * 60

    public init(start: Int, end: Int, defaultZone: String = "UTC") {
        self.start = start
        self.end = end
        self.defaultZone = defaultZone
    }

    /// Whether a local time (minutes after midnight) is inside the window.
    public func contains(minuteOfDay minute: Int) -> Bool {
        start < end ? (start <= minute && minute < end) : (minute >= start || minute < end)
    }

    /// Whether `now` is inside the window in `zone`.
    public func contains(_ now: Date, in zone: TimeZone) -> Bool {
        let local = Int((now.timeIntervalSince1970 + Double(zone.secondsFromGMT(for: now))).rounded(.down))
        let minute = (local / 60) % Self.minutesPerDay
        return contains(minuteOfDay: minute < 0 ? minute + Self.minutesPerDay : minute)
    }

    /// The next instant after `now` at which the window opens in `zone` (UNIX seconds): the first time local clocks
    /// there read the start, or the instant they jump over it on a day that skips it.
    ///
    /// Worked out from the zone's offsets, not with `Calendar.nextDate`, which in several zones (Lord Howe's half-hour
    /// change, Chatham's, Nuuk's midnight one) returned the next day's opening around a change, a day late.
    public func nextOpening(after now: Date, in zone: TimeZone) -> Int64 {
        let day: Int64 = 86_400
        let startOfDay = Int64(start) * 60
        var from = Int64(now.timeIntervalSince1970.rounded(.down)) + 1
        // The offset is read at the last second not counted (`known`): a change at `from` itself is then found.
        var known = from - 1
        // Each turn passes one change of offset; a few days hold at most a few.
        for _ in 0..<8 {
            let offset = Self.offset(of: zone, at: known)
            // The first instant from `from` on at which clocks at this offset read the start.
            let wall = from + offset
            var opening = wall - Self.modulo(wall, day) + startOfDay - offset
            if opening < from { opening += day }
            guard let change = Self.firstChange(of: zone, after: known, through: opening, from: offset) else {
                return opening
            }
            // Clocks that jump forward skip the wall times from `change + offset` on: a start among them opens there.
            let jump = Self.offset(of: zone, at: change) - offset
            if jump > 0 && Self.modulo(startOfDay - (change + offset), day) < jump { return change }
            from = change
            known = change
        }
        return from
    }

    private static func offset(of zone: TimeZone, at second: Int64) -> Int64 {
        Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: Double(second))))
    }

    private static func modulo(_ value: Int64, _ divisor: Int64) -> Int64 { (value % divisor + divisor) % divisor }

    /// The first second after `start`, up to `end`, at which `zone`'s offset is no longer `offset`; nil if it holds.
    /// Looked for an hour at a time (no zone changes twice within one), then to the second.
    private static func firstChange(of zone: TimeZone, after start: Int64, through end: Int64, from offset: Int64)
        -> Int64?
    {
        var low = start
        while low < end {
            var high = min(low + 3600, end)
            guard Self.offset(of: zone, at: high) == offset else {
                while high - low > 1 {
                    let middle = low + (high - low) / 2
                    if Self.offset(of: zone, at: middle) == offset { low = middle } else { high = middle }
                }
                return high
            }
            low = high
        }
        return nil
    }

    /// `"HH:MM"` as minutes after midnight.
    static func minutes(_ text: String) -> Int? {
        let bytes = Array(text.utf8)
        guard bytes.count == 5, bytes[2] == UInt8(ascii: ":"),
            bytes.indices.allSatisfy({ $0 == 2 || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[$0]) })
        else {
            return nil
        }
        let digit = { (index: Int) in Int(bytes[index] - UInt8(ascii: "0")) }
        let hour = digit(0) * 10 + digit(1)
        let minute = digit(3) * 10 + digit(4)
        guard hour < 24, minute < 60 else { return nil }
        return hour * 60 + minute
    }

    /// A job's `local_window` and `default_timezone` members, checked: nil when the job has no window.
    /// `reachesDevicesOnly`: the job is a broadcast or an activity's updates, which have no users with hours.
    static func decode(
        _ window: JSONValue?, defaultZone: JSONValue?,
        reachesDevicesOnly: Bool
    ) throws(JobError) -> LocalWindow? {
        let zone = try PushJob.string(defaultZone, named: "default_timezone")
        guard let window, window != .null else {
            if zone != nil { throw .localWindow("\"default_timezone\" goes with a \"local_window\"") }
            return nil
        }
        if reachesDevicesOnly {
            throw .localWindow(
                "a broadcast or an activity's updates reach devices, not users with hours: give no "
                    + "\"local_window\" with \"channel_id\" or \"activity\"")
        }
        guard case .object = window else {
            throw .wrongType(
                field: "local_window", expected: "an object {\"start\": \"HH:MM\", \"end\": \"HH:MM\"}",
                got: window.typeName)
        }
        if case .object(let members) = window,
            let other = members.first(where: { $0.key != "start" && $0.key != "end" })
        {
            throw .localWindow("unknown member \"\(JobError.echo(other.key))\" (a window has \"start\" and \"end\")")
        }
        var bounds: [Int] = []
        var written: [String] = []
        for name in ["start", "end"] {
            guard let text = try PushJob.string(window[name], named: "local_window.\(name)") else {
                throw .missingField("local_window.\(name)")
            }
            guard let minutes = minutes(text) else {
                throw .wrongType(
                    field: "local_window.\(name)", expected: "a local time \"HH:MM\" (00:00 to 23:59)",
                    got: "\"\(text.prefix(20))\"")
            }
            bounds.append(minutes)
            written.append(text)
        }
        guard bounds[0] != bounds[1] else {
            throw .localWindow(
                "start and end are both \(written[0]): give a window of at least a minute (a job "
                    + "without local_window sends at any hour)")
        }
        if let zone, let problem = TimeZoneName.problem(zone) { throw .localWindow("default_timezone: \(problem)") }
        return LocalWindow(start: bounds[0], end: bounds[1], defaultZone: zone ?? "UTC")
    }
}

/// Users' time zones: IANA names (`Europe/Paris`), checked against the system's time zone database
/// (`/usr/share/zoneinfo`, Debian's tzdata).
public enum TimeZoneName {
    public static let database = "/usr/share/zoneinfo"
    /// The longest name taken (the database's longest is about 30 bytes).
    static let maximumLength = 64

    /// Names found in the database: every registration event that carries a zone asks, and asking the file system
    /// costs two stat(2) calls. Bounded by the database's few hundred names.
    private static let known = Locked<Set<String>>([])

    /// Why `name` is not a time zone of the database, or nil if it is one.
    public static func problem(_ name: String) -> String? {
        if known.withLock({ $0.contains(name) }) { return nil }
        let problem = lookUp(name)
        if problem == nil { known.withLock { _ = $0.insert(name) } }
        return problem
    }

    private static func lookUp(_ name: String) -> String? {
        let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/_+-".utf8)
        let shown = "\"\(name.prefix(maximumLength))\""
        guard !name.isEmpty, name.utf8.count <= maximumLength, name.utf8.allSatisfy(allowed.contains),
            !name.hasPrefix("/"), !name.split(separator: "/").contains(where: { $0.hasPrefix("-") })
        else {
            return "\(shown) is not an IANA time zone name (such as Europe/Paris or America/New_York)"
        }
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: database, isDirectory: &isDirectory), isDirectory.boolValue else {
            return "the system's time zone database (\(database)) is missing: install tzdata"
        }
        guard FileManager.default.fileExists(atPath: database + "/" + name, isDirectory: &isDirectory),
            !isDirectory.boolValue, TimeZone(identifier: name) != nil
        else {
            return "\(shown) is not in the system's time zone database (IANA names such as Europe/Paris)"
        }
        return nil
    }
}

/// A windowed job cut by its users' local hours, as it is about to start: who may be sent to now, and who waits for
/// which opening. Each group that waits becomes a part of the job (`WindowSplit.partBody`), published when the job
/// settles: the job as enqueued, with only those users (and tokens) and `send_at` at the opening, so that it waits
/// in the broker's delay queues as a scheduled job does and is checked against the window again when it comes back.
public struct WindowSplit: Sendable {
    public struct Part: Sendable, Equatable {
        public var opensAt: Int64
        public var users: [String]
        public var tokens: [String]

        public init(opensAt: Int64, users: [String], tokens: [String]) {
            (self.opensAt, self.users, self.tokens) = (opensAt, users, tokens)
        }

        /// What names the part among its job's (`Worker.windowPartHeader`): its opening and a digest of who it
        /// reaches (FNV-1a, 64 bits), the same however often its job's settlement publishes it.
        public var name: String {
            var hash: UInt64 = 0xcbf2_9ce4_8422_2325
            for text in users + [""] + tokens {
                for byte in text.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
                hash = (hash ^ 0xff) &* 0x100_0000_01b3
            }
            return "\(opensAt)-" + String(hash, radix: 16)
        }
    }

    public var users: [String] = []
    public var tokens: [String] = []
    public var parts: [Part] = []
    /// Users and tokens whose window opens only after the job's deadline: expired, never sent.
    public var expired = 0
    /// The users and tokens the job named as it arrived (before the cut).
    public let named: Int

    /// Every user and token that waits.
    public var waiting: Int { parts.reduce(0) { $0 + $1.users.count + $1.tokens.count } }
    /// Nothing waits and nothing expired: the job runs as it is.
    public var isWhole: Bool { parts.isEmpty && expired == 0 }

    /// Nothing cut: a windowed job settled unsent (cancelled before it was due), which named `named` users and tokens.
    public init(named: Int) { self.named = named }

    /// `zones`: the time zones the users registered (a user without one is absent).
    public init(_ job: PushJob, window: LocalWindow, zones: [String: String], now: Date, logger: Logger) {
        named = job.users.count + job.tokens.count
        var verdicts: [String: (open: Bool, opensAt: Int64)] = [:]
        var unknown: Set<String> = []
        let fallback = TimeZone(identifier: window.defaultZone) ?? TimeZone(secondsFromGMT: 0)!
        func verdict(_ name: String?) -> (open: Bool, opensAt: Int64) {
            let name = name ?? window.defaultZone
            if let known = verdicts[name] { return known }
            let zone =
                TimeZone(identifier: name)
                ?? {
                    unknown.insert(name)
                    return fallback
                }()
            let found = window.contains(now, in: zone) ? (true, 0) : (false, window.nextOpening(after: now, in: zone))
            verdicts[name] = found
            return found
        }
        var waiting: [Int64: Part] = [:]
        func place(_ target: String, zone: String?, isUser: Bool) {
            let (open, opensAt) = verdict(zone)
            if open {
                if isUser { users.append(target) } else { tokens.append(target) }
            } else if let deadline = job.deadline, opensAt >= deadline {
                // A notification still waiting at its deadline is not sent: one whose window opens then never goes.
                expired += 1
            } else {
                // In place: a copy of the part per target would copy its arrays each time.
                let empty = Part(opensAt: opensAt, users: [], tokens: [])
                if isUser {
                    waiting[opensAt, default: empty].users.append(target)
                } else {
                    waiting[opensAt, default: empty].tokens.append(target)
                }
            }
        }
        for user in job.users { place(user, zone: zones[user], isUser: true) }
        for token in job.tokens { place(token, zone: nil, isUser: false) }
        parts = waiting.values.sorted { $0.opensAt < $1.opensAt }
        if !unknown.isEmpty {
            logger.warning(
                "users' time zones the system does not know: their job's default_timezone is used",
                ["job.id": job.id, "time_zones": unknown.sorted().prefix(5).joined(separator: ",")])
        }
    }

    /// The body of a part: `original` (the job as enqueued) with its `users`, `tokens` and `send_at` replaced, every
    /// other member as written; nil if `original` does not read as a JSON object (it decoded as a job a moment ago).
    public static func partBody(_ original: [UInt8], users: [String], tokens: [String], sendAt: Int64) -> [UInt8]? {
        let names = JSONNames(["users", "tokens", "send_at"])
        var ranges: [(range: Range<Int>, index: Int)] = []
        // Within the depth the job was decoded within.
        let depth = PushJob.Limits().maximumDepth + PushJob.retryWrapperDepth
        let read = try? JSONReader.readObject(original, maximumDepth: depth, known: names) {
            reader, index throws(JSONError) in
            guard let index else { return }
            let start = reader.offset
            _ = try reader.checkValue()
            ranges.append((start..<reader.offset, index))
        }
        guard case .object? = read else { return nil }
        func list(_ values: [String]) -> [UInt8] {
            Array(("[" + values.map(JSONString.quote).joined(separator: ",") + "]").utf8)
        }
        let replacements = [list(users), list(tokens), Array(String(sendAt).utf8)]
        var body: [UInt8] = []
        body.reserveCapacity(original.count)
        var position = 0
        if !ranges.contains(where: { $0.index == 2 }), let open = original.firstIndex(of: UInt8(ascii: "{")) {
            body += original[...open] + Array("\"send_at\":\(sendAt),".utf8)
            position = open + 1
        }
        for (range, index) in ranges.sorted(by: { $0.range.lowerBound < $1.range.lowerBound }) {
            body += original[position..<range.lowerBound] + replacements[index]
            position = range.upperBound
        }
        return body + original[position...]
    }
}
