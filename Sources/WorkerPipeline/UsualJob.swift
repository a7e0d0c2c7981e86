import APNsModel
import JSON

#if canImport(Glibc)
    import Glibc
#endif

extension PushJob {
    /// A job of the usual shape decoded in one pass over its bytes, or nil for any other body, valid or not: `decode`
    /// then reads that one member by member and judges it, giving the reason for a refusal.
    ///
    /// The usual shape: a JSON object whose members are among `id`, `topic`, `users`, `tokens`, `environment`,
    /// `push_type`, `priority`, `expiration`, `collapse_id`, `deadline`, `send_at` and `payload` (an object, any valid
    /// JSON in it), each at most once; their strings without escapes or bytes beyond ASCII, whole numbers (above
    /// Int64.min), device tokens in lower case, and no Live Activity push type. Its members are judged by the
    /// functions that judge the member-by-member reading's (`checkTargets`, `SendingOptions`, `bundle`, `sized`), and
    /// its payload is checked in place by the same JSON reader, so that it returns the job that reading returns
    /// (`UsualJobTests` holds the two to it).
    ///
    /// Why: most jobs are of this shape, and for a single-token job the member-by-member reading (a closure and a
    /// typed value per member, the general checks for members that are absent) cost more than its HTTP/2 request
    /// leaves to the rest of the job.
    /// A body outside the shape costs what was read of it before it showed (at most one pass): the worker's retries
    /// name their `retry` before their payload, and other kinds their own member.
    static func decodeUsual(
        _ body: [UInt8], defaultTopic: String?, fallbackID: () -> String, limits: Limits
    ) -> PushJob? {
        // The top-level object is at depth 1, its arrays and its payload at 2.
        guard body.count <= limits.maximumMessageSize, limits.maximumDepth >= 2 else { return nil }
        return body.withUnsafeBufferPointer { bytes -> PushJob? in
            var scanner = UsualJobScanner(bytes: bytes)
            // Read into a value here rather than returned as an optional: an optional of them was destroyed through
            // the runtime's generic functions, for every job.
            var members = UsualMembers()
            guard scanner.read(into: &members, maximumDepth: limits.maximumDepth) else { return nil }
            // A rule it breaks leaves the job to the member-by-member reading, which tells the reason.
            return try? members.job(body, defaultTopic: defaultTopic, fallbackID: fallbackID, limits: limits)
        }
    }
}

/// The members of a usual job as its bytes give them (`PushJob.decodeUsual`).
private struct UsualMembers {
    var id, topic: String?
    var users: [String] = []
    var tokens: [String] = []
    var sending = PushJob.SendingMembers()
    var payload: Range<Int>?

    /// The job these members make, judged as `PushJob.decode` judges them; nil for what the member-by-member reading
    /// makes otherwise (tokens it lowers, a Live Activity push).
    func job(_ body: [UInt8], defaultTopic: String?, fallbackID: () -> String, limits: PushJob.Limits)
        throws(JobError) -> PushJob?
    {
        guard let payload,
            try PushJob.checkTargets(
                users: users, tokens: tokens, retrying: false, limits: limits, tokensChecked: true)
        else { return nil }
        let sending = try PushJob.SendingOptions(self.sending, defaultPushType: .alert)
        guard sending.pushType != .liveactivity else { return nil }
        let bundle = try PushJob.bundle(topic: topic, defaultTopic: defaultTopic)
        return PushJob(
            ownID: id, fallbackID: fallbackID, bundle: bundle, users: users, tokens: tokens, sending: sending,
            payload: try PushJob.sized(body[payload], for: sending.pushType))
    }
}

/// Reads a usual job's members off its bytes, giving up (nil) at the first thing outside the usual shape.
private struct UsualJobScanner {
    let bytes: UnsafeBufferPointer<UInt8>
    var position = 0

    private enum Member: Int {
        case id, topic, users, tokens, environment, pushType, priority, expiration, collapseID, deadline, sendAt
        case payload
    }

    /// Reads the whole body into `members`; false for anything outside the usual shape (`members` then partly read).
    mutating func read(into members: inout UsualMembers, maximumDepth: Int) -> Bool {
        skipWhitespace()
        guard take(UInt8(ascii: "{")) else { return false }
        var seen = 0
        skipWhitespace()
        if !take(UInt8(ascii: "}")) {
            repeat {
                skipWhitespace()
                guard let name = plainString(), let member = Self.member(named: name),
                    seen & (1 << member.rawValue) == 0
                else { return false }
                seen |= 1 << member.rawValue
                skipWhitespace()
                guard take(UInt8(ascii: ":")) else { return false }
                skipWhitespace()
                guard read(member, into: &members, maximumDepth: maximumDepth) else { return false }
                skipWhitespace()
            } while take(UInt8(ascii: ","))
            guard take(UInt8(ascii: "}")) else { return false }
        }
        skipWhitespace()
        return position == bytes.count
    }

    private mutating func read(_ member: Member, into members: inout UsualMembers, maximumDepth: Int) -> Bool {
        switch member {
        case .id: return Self.store(string(), in: &members.id)
        case .topic: return Self.store(string(), in: &members.topic)
        case .environment: return Self.store(string(), in: &members.sending.environment)
        case .pushType: return Self.store(string(), in: &members.sending.pushType)
        case .collapseID: return Self.store(string(), in: &members.sending.collapseID)
        case .priority: return Self.store(integer(), in: &members.sending.priority)
        case .expiration: return Self.store(integer(), in: &members.sending.expiration)
        case .deadline: return Self.store(integer(), in: &members.sending.deadline)
        case .sendAt: return Self.store(integer(), in: &members.sending.sendAt)
        case .users:
            guard let users = strings(tokens: false) else { return false }
            members.users = users
        case .tokens:
            guard let tokens = strings(tokens: true) else { return false }
            members.tokens = tokens
        case .payload:
            // The top-level object is at depth 1, its members' values at 2 (as `JSONReader.readObject` counts).
            let start = position
            guard let end = try? JSONReader.checkObject(in: bytes, at: start, depth: 2, maximumDepth: maximumDepth)
            else { return false }
            position = end
            members.payload = start..<end
        }
        return true
    }

    private static func store<Value>(_ value: Value?, in field: inout Value?) -> Bool {
        guard let value else { return false }
        field = value
        return true
    }

    private static func member(named name: UnsafeBufferPointer<UInt8>) -> Member? {
        func named(_ literal: StaticString, _ member: Member) -> Member? {
            guard name.count == literal.utf8CodeUnitCount else { return nil }
            for index in 0..<name.count where name[index] != literal.utf8Start[index] { return nil }
            return member
        }
        switch name.count {
        case 2: return named("id", .id)
        case 5: return named("topic", .topic) ?? named("users", .users)
        case 6: return named("tokens", .tokens)
        case 7: return named("payload", .payload) ?? named("send_at", .sendAt)
        case 8: return named("priority", .priority) ?? named("deadline", .deadline)
        case 9: return named("push_type", .pushType)
        case 10: return named("expiration", .expiration)
        case 11: return named("environment", .environment) ?? named("collapse_id", .collapseID)
        default: return nil
        }
    }

    private mutating func skipWhitespace() { position = JSONBytes.pastWhitespace(bytes, from: position) }

    private mutating func take(_ byte: UInt8) -> Bool {
        guard position < bytes.count, bytes[position] == byte else { return false }
        position += 1
        return true
    }

    /// A string of printable ASCII without escapes: its bytes, past its closing quote.
    private mutating func plainString() -> UnsafeBufferPointer<UInt8>? {
        guard take(UInt8(ascii: "\"")) else { return nil }
        let start = position
        while position < bytes.count {
            let byte = bytes[position]
            if byte == UInt8(ascii: "\"") {
                position += 1
                return UnsafeBufferPointer(rebasing: bytes[start..<(position - 1)])
            }
            guard byte >= 0x20, byte < 0x80, byte != UInt8(ascii: "\\") else { return nil }
            position += 1
        }
        return nil
    }

    private mutating func string() -> String? {
        plainString().map { String(decoding: $0, as: UTF8.self) }
    }

    /// An array of strings: users as plain strings, tokens as `token()` reads them. The first string is read alone:
    /// an array of one (most jobs name one token or one user) is then made at its size, where appending grew one.
    private mutating func strings(tokens: Bool) -> [String]? {
        let start = position
        guard take(UInt8(ascii: "[")) else { return nil }
        skipWhitespace()
        if take(UInt8(ascii: "]")) { return [] }
        guard let first = element(token: tokens) else { return nil }
        skipWhitespace()
        if take(UInt8(ascii: "]")) { return [first] }
        var strings: [String] = []
        // Only a count worth reserving: reserving none still costs a call that makes a new empty buffer.
        let leading = JSONBytes.leadingStringCount(bytes, at: start)
        if leading > 0 { strings.reserveCapacity(leading) }
        strings.append(first)
        while take(UInt8(ascii: ",")) {
            skipWhitespace()
            guard let next = element(token: tokens) else { return nil }
            strings.append(next)
            skipWhitespace()
        }
        return take(UInt8(ascii: "]")) ? strings : nil
    }

    private mutating func element(token: Bool) -> String? {
        guard let text = token ? self.token() : plainString() else { return nil }
        return String(decoding: text, as: UTF8.self)
    }

    /// A device token as the project keeps them, lower-case hex (`APNsNotification.scanDeviceToken`), checked here
    /// on its bytes before a string is made of it, so that the job's checks need not scan it again
    /// (`PushJob.checkTargets`); nil for any other token, which the member-by-member reading lowers or refuses.
    private mutating func token() -> UnsafeBufferPointer<UInt8>? {
        guard let text = quoted() else { return nil }
        let (valid, hasUpperCase) = APNsNotification.scanDeviceToken(UnsafeRawBufferPointer(text))
        return valid && !hasUpperCase ? text : nil
    }

    /// The bytes up to the next quote, past it (`memchr`: a token's 64 bytes in a few instructions).
    private mutating func quoted() -> UnsafeBufferPointer<UInt8>? {
        guard take(UInt8(ascii: "\"")), let base = bytes.baseAddress,
            let quote = memchr(base + position, Int32(UInt8(ascii: "\"")), bytes.count - position)
        else { return nil }
        let start = base + position
        let text = UnsafeBufferPointer(start: start, count: UnsafeRawPointer(quote) - UnsafeRawPointer(start))
        position += text.count + 1
        return text
    }

    /// A whole number written as JSON writes one (no fraction or exponent) that fits an Int64.
    private mutating func integer() -> Int64? {
        let negative = take(UInt8(ascii: "-"))
        let start = position
        var value: Int64 = 0
        while position < bytes.count, bytes[position] &- UInt8(ascii: "0") < 10 {
            let (times, overflow) = value.multipliedReportingOverflow(by: 10)
            let (sum, carry) = times.addingReportingOverflow(Int64(bytes[position] &- UInt8(ascii: "0")))
            guard !overflow, !carry else { return nil }
            value = sum
            position += 1
        }
        let digits = position - start
        guard digits > 0, digits == 1 || bytes[start] != UInt8(ascii: "0") else { return nil }
        if position < bytes.count {
            switch bytes[position] {
            case UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"): return nil
            default: break
            }
        }
        return negative ? -value : value
    }
}
