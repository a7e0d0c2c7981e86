import APNsModel
import Foundation
import JSON
import Telemetry

/// One job from PUSH_JOBS_QUEUE, decoded and checked (the contract in docs/contract.md).
///
/// Its members are shared until changed (`PushJobStorage`): a job passes through several arrays and filters and into
/// its progress on its way to sending. Only decoding sets them, but for the rate group its sender gives it.
public struct PushJob: Sendable, Equatable {
    /// What the job holds beside its notifications' fields (`PushJobStorage`).
    struct Members: Sendable, Equatable {
        var id: String
        var idFromBody: Bool = true
        var users: [String]
        var tokens: [String]
        var environment: APNsEnvironment
        var sendAt: Int64? = nil
        var localWindow: LocalWindow? = nil
        var attempt: Int = 1
        var retryTargets: [DeviceTarget]? = nil
        var originalBody: [UInt8]? = nil
        var originalNamed: Int? = nil
        var rateGroup: RateGroup? = nil
        var kind = Kind.devices
    }

    /// What a job reaches, decided once when it is decoded: the pipeline switches on it.
    public enum Kind: Sendable, Equatable {
        /// A notification per device token: its users' cached tokens and its own `tokens`.
        case devices
        /// Live Activity pushes, a notification per token: its users' (push-to-start) tokens, its own `tokens`, and
        /// the update tokens of the activity it names (`"activity": "<id>"`, as the app registered them).
        case liveActivity(activity: String?)
        /// One broadcast request (iOS 18, `channel_id`) that APNs fans out to every device subscribed to the channel.
        case broadcast(channelID: String)
    }

    private var storage: PushJobStorage

    /// A job sent as `sending` says, to its push type's topic of `bundle`: every kind of job is made this way, so that
    /// none can leave a sending member out. `ownID`: the id the job named, if any; an empty one is none (every job
    /// written with `"id": ""` would otherwise share one idempotency record and one cancellation).
    init(
        ownID: String?, fallbackID: () -> String, bundle: String, users: [String], tokens: [String],
        sending: borrowing SendingOptions, payload: ArraySlice<UInt8>
    ) {
        let named = ownID?.isEmpty == false ? ownID : nil
        storage = PushJobStorage(
            fields: APNsNotification.Message(
                topic: sending.pushType.topic(forBundle: bundle), pushType: sending.pushType,
                priority: sending.priority, expiration: sending.expiration, collapseID: sending.collapseID,
                apnsID: nil, payload: payload, sendBy: sending.deadline),
            members: Members(
                id: named ?? fallbackID(), idFromBody: named != nil, users: users, tokens: tokens,
                environment: sending.environment, sendAt: sending.sendAt))
    }

    /// Changes the job's members in place when this value alone holds its box, in a copy of it otherwise (its
    /// notifications hold it too once they are made).
    private mutating func change(_ apply: (inout Members) -> Void) {
        if !isKnownUniquelyReferenced(&storage) {
            storage = PushJobStorage(fields: storage.fields, members: storage.members)
        }
        apply(&storage.members)
    }

    /// The box its notifications share: the job's fields they are sent with (`JobProgress.notification`).
    var message: NotificationMessage { storage }

    public static func == (lhs: PushJob, rhs: PushJob) -> Bool {
        lhs.storage === rhs.storage
            || (lhs.storage.fields == rhs.storage.fields && lhs.storage.members == rhs.storage.members)
    }

    public var id: String { storage.members.id }
    /// The job named itself (`id` in the body); otherwise `id` is the caller's fallback.
    public var idFromBody: Bool { storage.members.idFromBody }
    /// The topic to send with, the push type's suffix included.
    public var topic: String { storage.fields.topic }
    public var users: [String] { storage.members.users }
    public var tokens: [String] { storage.members.tokens }
    /// `tokens[index]`, read where the job holds them (`tokens` makes a copy of the array).
    func token(at index: Int) -> String { storage.members.tokens[index] }

    /// The Live Activity whose update tokens the job reaches, if its kind names one.
    public var activity: String? {
        guard case .liveActivity(let activity) = storage.members.kind else { return nil }
        return activity
    }
    /// Where the direct `tokens` live; users' tokens carry their own environment from the cache.
    public var environment: APNsEnvironment { storage.members.environment }
    public var pushType: APNsPushType { storage.fields.pushType }
    public var priority: APNsPriority { storage.fields.priority }
    public var expiration: Int64? { storage.fields.expiration }
    public var collapseID: String? { storage.fields.collapseID }
    /// UNIX seconds: a notification not handed to APNs by then is not sent (expired). Not Apple's `expiration`,
    /// which is how long APNs keeps a notification for a device that is offline.
    public var deadline: Int64? { storage.fields.sendBy }
    /// UNIX seconds: nothing of the job is sent before then (it waits in the broker's delay queues).
    public var sendAt: Int64? { storage.members.sendAt }
    /// The hours of each user's local day in which the job may reach them (`local_window`); nil: any hour.
    public var localWindow: LocalWindow? { storage.members.localWindow }
    /// The payload exactly as the job wrote it.
    public var payload: [UInt8] { Array(storage.fields.payload) }
    /// 1 for a job as enqueued; n for the (n-1)-th retry the worker scheduled.
    public var attempt: Int { storage.members.attempt }
    /// On a retry: exactly the notifications still to send (users already resolved).
    public var retryTargets: [DeviceTarget]? { storage.members.retryTargets }
    /// On a retry: the job as its sender enqueued it, which is what is parked if the last attempt fails too.
    public var originalBody: [UInt8]? { storage.members.originalBody }
    /// On a retry: the users and tokens the job as enqueued named (its size, for its progress record).
    public var originalNamed: Int? { storage.members.originalNamed }
    /// Not in the job's JSON: the shared rate limit of the credential that sends its topic, as the sender said then.
    public var rateGroup: RateGroup? {
        get { storage.members.rateGroup }
        set { change { $0.rateGroup = newValue } }
    }
    public var kind: Kind { storage.members.kind }

    /// The job reaching only these of its users and tokens: a windowed job's, those whose hours have come.
    func reaching(users: [String], tokens: [String]) -> PushJob {
        var job = self
        job.change { members in
            members.users = users
            members.tokens = tokens
        }
        return job
    }

    /// The request a broadcast job (`channel_id`) sends on `channelID`.
    public func broadcast(on channelID: String) -> APNsBroadcast {
        APNsBroadcast(
            bundle: APNsPushType.bundle(ofTopic: topic), channelID: channelID, priority: priority,
            expiration: expiration ?? 0, payload: payload, sendBy: deadline)
    }

    public struct Limits: Sendable {
        public var maximumMessageSize = 1 << 20
        public var maximumTargets = 100_000
        public var maximumDepth = JSONReader.defaultMaximumDepth

        public init() {}
    }

    /// The worker's retry wrapper around the original job: `retry.job` nests it two levels deeper, and the retry
    /// body holds it beside the retry's own targets.
    static let retryWrapperDepth = 2
    static let retrySizeFactor = 3
    /// A larger deadline (or send_at) is almost certainly milliseconds (`APNsRules.latestSeconds`).
    public static let latestDeadline = APNsRules.latestSeconds
    /// How far ahead `send_at` may be (seconds).
    public static let longestSchedule: Int64 = 7 * 24 * 3600

    /// Decodes a message body. `defaultTopic` is the configured topic of jobs that name none, a bundle ID already
    /// checked (`APNsRules.topicProblem`) by the configuration that gave it; `fallbackID` names
    /// jobs that carry no id, made only for them (most jobs name themselves, and making an id is not free).
    public static func decode(
        _ body: [UInt8], defaultTopic: String?, fallbackID: @autoclosure () -> String,
        limits: Limits = .init()
    ) throws(JobError) -> PushJob {
        if let usual = decodeUsual(body, defaultTopic: defaultTopic, fallbackID: fallbackID, limits: limits) {
            return usual
        }
        return try decodeMemberByMember(body, defaultTopic: defaultTopic, fallbackID: fallbackID(), limits: limits)
    }

    /// `decode` for any body: each member the decoder knows read into its own field, then judged. `decodeUsual`
    /// judges the members it reads with the same functions (`checkTargets`, `SendingOptions`, `bundle`, `sized`); a
    /// rule written anywhere else here must go there too, or that one must decline what the rule is about
    /// (`UsualJobTests` compares the two readings).
    static func decodeMemberByMember(
        _ body: [UInt8], defaultTopic: String?, fallbackID: @autoclosure () -> String,
        limits: Limits = .init()
    ) throws(JobError) -> PushJob {
        let members = try JobMembers(body, limits: limits)
        let ownID = try string(members.id, named: "id")
        let retry = try retryState(members.retry)
        let (users, tokens, channelID, activity) = try reach(members, retrying: retry != nil, limits: limits)
        let liveActivityJob = members.liveActivity != nil || channelID != nil || activity != nil
        let sending = try SendingOptions(
            SendingMembers(members), defaultPushType: liveActivityJob ? .liveactivity : .alert)
        let localWindow = try LocalWindow.decode(
            members.localWindow, defaultZone: members.defaultTimezone,
            reachesDevicesOnly: channelID != nil || activity != nil)
        if activity != nil && sending.pushType != .liveactivity {
            throw .liveActivity(
                "push_type is \"\(sending.pushType.rawValue)\": an activity's update tokens take Live "
                    + "Activity pushes only (liveactivity)")
        }
        let bundle = try bundle(topic: string(members.topic, named: "topic"), defaultTopic: defaultTopic)
        var job: PushJob
        if let channelID {
            job = try broadcastJob(
                members, body, ownID: ownID, fallbackID: fallbackID, bundle: bundle, channelID: channelID,
                sending: sending)
        } else if try flag(members.prevalidate, named: "prevalidate") {
            job = try prevalidationJob(
                members, body, ownID: ownID, fallbackID: fallbackID, bundle: bundle, users: users, tokens: tokens,
                sending: sending)
        } else {
            job = PushJob(
                ownID: ownID, fallbackID: fallbackID, bundle: bundle, users: users, tokens: tokens, sending: sending,
                payload: try payload(members, body, pushType: sending.pushType))
        }
        let liveActivity = activity != nil || job.pushType == .liveactivity
        job.change { members in
            members.localWindow = localWindow
            // A job that names an activity is a Live Activity job (decoding refused any other push type for it).
            if members.kind == .devices && liveActivity {
                members.kind = .liveActivity(activity: activity)
            }
            if let retry {
                members.attempt = retry.attempt
                members.retryTargets = retry.targets
                members.originalBody = retry.original.map { Array(body[$0.range]) }
                members.originalNamed = retry.original?.named
            }
        }
        return job
    }

    /// The app the job is for: its `topic`, else the configured default, checked against Apple's rule for bundle IDs.
    /// The configured default was checked with the configuration (`SettingKind.topic`), so a job that names it, or
    /// none, is not checked again: most jobs, each of which would otherwise pay a pass over its topic's bytes.
    static func bundle(topic: String?, defaultTopic: String?) throws(JobError) -> String {
        guard let bundle = topic ?? defaultTopic, !bundle.isEmpty else {
            throw .missingTopic
        }
        guard bundle != defaultTopic else { return bundle }
        do throws(APNsRequestError) { try APNsRules.checkTopic(bundle, field: "\"topic\"") } catch {
            throw .breaksRule(error)
        }
        return bundle
    }

    /// Who a job reaches, as its members say it, checked: users and tokens (canonical), or a channel with no one
    /// beside it, and a Live Activity.
    private static func reach(_ members: JobMembers, retrying: Bool, limits: Limits) throws(JobError)
        -> (users: [String], tokens: [String], channelID: String?, activity: String?)
    {
        let users = try strings(members.users, named: "users")
        var tokens = try strings(members.tokens, named: "tokens")
        let channelID = try string(members.channelID, named: "channel_id")
        if let channelID {
            guard users.isEmpty && tokens.isEmpty else {
                throw .broadcast("a broadcast reaches the channel's subscribers: give no \"users\" or \"tokens\"")
            }
            do throws(APNsRequestError) { try APNsChannelID.check(channelID) } catch { throw .breaksRule(error) }
        }
        let activity = try string(members.activity, named: "activity")
        if let activity {
            guard LiveActivityID.isValid(activity) else { throw .badActivityID }
            guard channelID == nil else {
                throw .broadcast("a broadcast reaches the channel's subscribers: give no \"activity\"")
            }
        }
        if channelID == nil && (activity == nil || !users.isEmpty || !tokens.isEmpty) {
            let tokensCanonical = try checkTargets(users: users, tokens: tokens, retrying: retrying, limits: limits)
            // Mapped only when a token needs it: a new array per job otherwise, for tokens already lower-case.
            if !tokensCanonical { tokens = tokens.map(APNsNotification.canonicalToken) }
        }
        return (users, tokens, channelID, activity)
    }

    /// Token pre-validation (from the source article): a silent background push to every target, so that APNs
    /// reports the dead tokens before a campaign's real send. The job's own payload and push type are not used, but a
    /// payload or live_activity it carries is checked like any other: it is the campaign's.
    private static func prevalidationJob(
        _ members: JobMembers, _ body: [UInt8], ownID: String?, fallbackID: () -> String, bundle: String,
        users: [String], tokens: [String], sending: borrowing SendingOptions
    ) throws(JobError) -> PushJob {
        if members.payload != nil || members.liveActivity != nil {
            _ = try payload(members, body, pushType: sending.pushType)
        }
        return PushJob(
            ownID: ownID, fallbackID: fallbackID, bundle: bundle, users: users, tokens: tokens,
            sending: SendingOptions(prevalidating: sending),
            payload: Array(#"{"aps":{"content-available":1}}"#.utf8)[...])
    }

    /// A `channel_id` job: a Live Activity update or end (a broadcast cannot start one), its payload at most 5 KB.
    private static func broadcastJob(
        _ members: JobMembers, _ body: [UInt8], ownID: String?, fallbackID: () -> String, bundle: String,
        channelID: String, sending: borrowing SendingOptions
    ) throws(JobError) -> PushJob {
        guard sending.pushType == .liveactivity else {
            throw .broadcast(
                "push_type is \"\(sending.pushType.rawValue)\": a broadcast is a Live Activity push (liveactivity)")
        }
        if try flag(members.prevalidate, named: "prevalidate") {
            throw .broadcast("a broadcast has no tokens to prevalidate")
        }
        if case .object(let fields)? = members.liveActivity?.value,
            fields.contains(where: { $0.key == "event" && $0.value == .string("start") })
        {
            throw .broadcast(
                "a broadcast cannot start a Live Activity: start it by push-to-start or in the app, with "
                    + "\"input_push_channel\"")
        }
        let payload = try payloadBytes(members, body)
        // The push type is liveactivity (checked above), and the job's topic that of Live Activities.
        var job = PushJob(
            ownID: ownID, fallbackID: fallbackID, bundle: bundle, users: [], tokens: [], sending: sending,
            payload: payload)
        job.change { $0.kind = .broadcast(channelID: channelID) }
        do throws(APNsRequestError) { try job.broadcast(on: channelID).validate() } catch { throw .breaksRule(error) }
        return job
    }

    /// A job's members as the body gives them, read in one pass: each member the decoder knows straight into its
    /// own field, the payload only checked and located (it is forwarded as written), anything else checked and
    /// skipped. Nothing is judged here but the JSON itself and the limits; `decode` checks the fields.
    struct JobMembers {
        enum Name: String, CaseIterable {
            case id, topic, users, tokens, environment
            case pushType = "push_type"
            case priority, expiration, deadline
            case sendAt = "send_at"
            case localWindow = "local_window"
            case defaultTimezone = "default_timezone"
            case collapseID = "collapse_id"
            case channelID = "channel_id"
            case activity, prevalidate, payload
            case liveActivity = "live_activity"
            case retry
        }
        static let names = JSONNames(Name.allCases.map(\.rawValue))

        var id, topic, environment, pushType, priority, expiration, deadline, sendAt, collapseID, channelID,
            activity: JSONValue?
        var prevalidate, retry, localWindow, defaultTimezone: JSONValue?
        var users, tokens: JSONStrings?
        /// Its value comes back empty: `range` locates it.
        var payload: JSONMember?
        var liveActivity: JSONMember?

        /// Reads `body` within the limits. A retry body (the worker's own) carries the original job inside it, so it
        /// may be larger and deeper than a job; any other body is held to the limits once read.
        init(_ body: [UInt8], limits: Limits) throws(JobError) {
            // Saturating: limits near Int.max (no limit at all) must not overflow.
            let (retrySize, sizeOverflows) = limits.maximumMessageSize.multipliedReportingOverflow(
                by: PushJob.retrySizeFactor)
            let (retryDepth, depthOverflows) = limits.maximumDepth.addingReportingOverflow(PushJob.retryWrapperDepth)
            guard sizeOverflows || body.count <= retrySize else {
                throw .tooLarge(size: body.count, limit: limits.maximumMessageSize)
            }
            var members = JobMembers()
            let topLevel: JSONTopLevel
            do {
                topLevel = try JSONReader.readObject(
                    body, maximumDepth: depthOverflows ? .max : retryDepth,
                    known: Self.names
                ) { reader, index throws(JSONError) in
                    guard let index else { return }
                    try members.read(Name.allCases[index], from: &reader)
                }
            } catch {
                // The reader checks every string it reads as UTF-8, and outside strings JSON is ASCII: a body that is
                // not UTF-8 never reads as JSON, so it is told apart only here, not checked byte by byte for every job.
                guard String(validating: body, as: UTF8.self) != nil else { throw .notUTF8 }
                if error.isTooDeep {
                    // Read with the retries' allowance, which a job without `retry` does not have.
                    throw .notJSON(
                        "nesting deeper than \(limits.maximumDepth) levels (\(retryDepth) in the worker's own retries) "
                            + "at byte \(error.offset)")
                }
                throw .notJSON(error.description)
            }
            let depth: Int
            switch topLevel {
            case .object(let measured): depth = measured
            case .other(let typeName): throw .notAnObject(typeName)
            }
            if members.retry == nil || members.retry == .null {
                guard body.count <= limits.maximumMessageSize else {
                    throw .tooLarge(size: body.count, limit: limits.maximumMessageSize)
                }
                guard depth <= limits.maximumDepth else {
                    throw .notJSON("nesting deeper than \(limits.maximumDepth) levels")
                }
            }
            self = consume members
        }

        private init() {}

        private mutating func read(_ name: Name, from reader: inout JSONReader) throws(JSONError) {
            let start = reader.offset
            switch name {
            case .id: id = try reader.readValue()
            case .topic: topic = try reader.readValue()
            case .users: users = try reader.readStrings()
            case .tokens: tokens = try reader.readStrings()
            case .environment: environment = try reader.readValue()
            case .pushType: pushType = try reader.readValue()
            case .priority: priority = try reader.readValue()
            case .expiration: expiration = try reader.readValue()
            case .deadline: deadline = try reader.readValue()
            case .sendAt: sendAt = try reader.readValue()
            case .localWindow: localWindow = try reader.readValue()
            case .defaultTimezone: defaultTimezone = try reader.readValue()
            case .collapseID: collapseID = try reader.readValue()
            case .channelID: channelID = try reader.readValue()
            case .activity: activity = try reader.readValue()
            case .prevalidate: prevalidate = try reader.readValue()
            case .retry: retry = try reader.readValue()
            case .payload:
                // The payload is forwarded byte for byte: checked, never built.
                let value = try reader.checkValue()
                payload = JSONMember(key: name.rawValue, value: value, range: start..<reader.offset)
            case .liveActivity:
                let value = try reader.readValue()
                liveActivity = JSONMember(key: name.rawValue, value: value, range: start..<reader.offset)
            }
        }
    }

    /// Returns whether every token is canonical already (lower-case). `tokensChecked`: the caller found every token
    /// valid and lower-case as it read them (`PushJob.decodeUsual`).
    static func checkTargets(
        users: [String], tokens: [String], retrying: Bool, limits: Limits, tokensChecked: Bool = false
    ) throws(JobError) -> Bool {
        guard !users.isEmpty || !tokens.isEmpty || retrying else { throw .noTargets }
        guard users.count + tokens.count <= limits.maximumTargets else {
            throw .tooManyTargets(users.count + tokens.count, limit: limits.maximumTargets)
        }
        for (index, user) in users.enumerated() where user.isEmpty || user.utf8.count > 256 {
            throw .badUser(field: "users[\(index)]")
        }
        var allCanonical = true
        for (index, token) in tokens.enumerated() where !tokensChecked {
            do throws(APNsRequestError) {
                if try !APNsNotification.validateDeviceToken(token) { allCanonical = false }
            } catch {
                throw .badToken(field: "tokens[\(index)]", error.description)
            }
        }
        return allCanonical
    }

    /// How a job's notifications are sent, read and checked against Apple's rules (the same the client applies
    /// before sending, `APNsRules`): a job that breaks one is refused now, with its reason, rather than accepted
    /// and failed notification by notification.
    // Not copyable: every implicit copy of it (its collapse id is a String) cost reference counts on the per-job path.
    struct SendingOptions: ~Copyable {
        let environment: APNsEnvironment
        let pushType: APNsPushType
        let priority: APNsPriority
        let expiration: Int64?
        let deadline: Int64?
        let sendAt: Int64?
        let collapseID: String?

        // Read into locals, then stored at once: a value that cannot be copied is initialized whole or not at all.
        init(_ members: borrowing SendingMembers, defaultPushType: APNsPushType) throws(JobError) {
            var environment = APNsEnvironment.production
            if let text = members.environment {
                guard let parsed = APNsEnvironment(rawValue: text) else { throw .badEnvironment(text) }
                environment = parsed
            }
            var pushType = defaultPushType
            if let text = members.pushType {
                guard let parsed = APNsPushType(rawValue: text) else { throw .unknownPushType(text) }
                pushType = parsed
            }
            var priority = pushType.defaultPriority
            if let number = members.priority {
                guard let parsed = APNsPriority(rawValue: Int(number)) else { throw .badPriority(number) }
                priority = parsed
            }
            let (expiration, deadline, sendAt, collapseID) =
                (members.expiration, members.deadline, members.sendAt, members.collapseID)
            if let deadline, deadline < 0 || deadline > PushJob.latestDeadline { throw .badDeadline(deadline) }
            if let sendAt {
                let now = Int64(Date().timeIntervalSince1970)
                if sendAt < 0 { throw .badSendAt("send_at \(sendAt) must be UNIX seconds, 0 or later") }
                if sendAt > PushJob.latestDeadline {
                    throw .badSendAt(
                        "send_at \(sendAt) is beyond \(APNsRules.latestSecondsText): give UNIX seconds, "
                            + "not milliseconds")
                }
                if sendAt > now + PushJob.longestSchedule {
                    throw .badSendAt(
                        "send_at \(sendAt) is \(sendAt - now) s ahead, more than the 7 days (604800 s) a job "
                            + "may wait")
                }
                // A job is sent at send_at or within a second after, and not once its deadline has come.
                if let deadline, deadline <= sendAt {
                    throw .badSendAt("deadline \(deadline) is not after send_at \(sendAt): nothing could be sent")
                }
            }
            do throws(APNsRequestError) {
                try APNsRules.checkPriority(priority, for: pushType)
                if let expiration { try APNsRules.checkExpiration(expiration) }
                if let collapseID { try APNsRules.checkCollapseID(collapseID, field: "\"collapse_id\"") }
            } catch {
                throw .breaksRule(error)
            }
            (self.environment, self.pushType, self.priority) = (environment, pushType, priority)
            (self.expiration, self.deadline, self.collapseID) = (expiration, deadline, collapseID)
            self.sendAt = sendAt
        }

        /// A pre-validation's: a silent background push at the power-considerate priority, kept by no device
        /// (expiration 0), without a collapse id; the job's environment, deadline and send_at.
        init(prevalidating job: borrowing SendingOptions) {
            (environment, pushType, priority) = (job.environment, .background, .considerPower)
            (expiration, deadline, sendAt, collapseID) = (0, job.deadline, job.sendAt, nil)
        }
    }

    private static func flag(_ value: JSONValue?, named field: String) throws(JobError) -> Bool {
        switch value {
        case nil, .null?: false
        case .bool(let flag)?: flag
        case let other?: throw .wrongType(field: field, expected: "true or false", got: other.typeName)
        }
    }

    /// The payload exactly as the job wrote it (its bytes in the body), or built from its `live_activity`, within
    /// the push type's size.
    private static func payload(_ members: JobMembers, _ body: [UInt8], pushType: APNsPushType) throws(JobError)
        -> ArraySlice<UInt8>
    {
        if members.liveActivity != nil && pushType != .liveactivity {
            throw .liveActivity("push_type is \"\(pushType.rawValue)\": a Live Activity is sent as liveactivity")
        }
        return try sized(payloadBytes(members, body), for: pushType)
    }

    /// `payload`, if its size is within the push type's.
    static func sized(_ payload: ArraySlice<UInt8>, for pushType: APNsPushType) throws(JobError) -> ArraySlice<UInt8> {
        do throws(APNsRequestError) { try APNsRules.checkPayloadSize(payload.count, for: pushType) } catch {
            throw .breaksRule(error)
        }
        return payload
    }

    /// The `payload` as the job wrote it, where the body holds it, or the one its `live_activity` builds (never both).
    private static func payloadBytes(_ members: JobMembers, _ body: [UInt8]) throws(JobError) -> ArraySlice<UInt8> {
        if let liveActivity = members.liveActivity {
            guard members.payload == nil else {
                throw .liveActivity("give \"payload\" or \"live_activity\", not both")
            }
            let now = Int64(Date().timeIntervalSince1970)
            return try LiveActivityRequest.payload(liveActivity, body: body, now: now)[...]
        }
        guard let member = members.payload else { throw .missingField("payload") }
        guard case .object = member.value else {
            throw .wrongType(field: "payload", expected: "an object", got: member.value.typeName)
        }
        return body[member.range]
    }

    /// The retry state, and where the original job sits in the body (absent in retries written before it was kept).
    private static func retryState(_ retry: JSONValue?) throws(JobError)
        -> (attempt: Int, targets: [DeviceTarget], original: (range: Range<Int>, named: Int)?)?
    {
        guard let retry, retry != .null else { return nil }
        guard case .object = retry, case .number(let attemptText)? = retry["attempt"], let attempt = Int(attemptText),
            (2...maximumAttempt).contains(attempt), case .array(let entries)? = retry["targets"], !entries.isEmpty
        else {
            throw .wrongType(field: "retry", expected: "the worker's retry state", got: retry.typeName)
        }
        var targets: [DeviceTarget] = []
        for (index, entry) in entries.enumerated() {
            guard case .string(let token)? = entry["token"], case .string(let environmentText)? = entry["environment"],
                let environment = APNsEnvironment(rawValue: environmentText),
                (try? APNsNotification.validateDeviceToken(token)) != nil
            else {
                throw .wrongType(
                    field: "retry.targets[\(index)]", expected: "a token and its environment", got: entry.typeName)
            }
            let user: String? = if case .string(let name)? = entry["user"] { name } else { nil }
            targets.append(DeviceTarget(token: token, environment: environment, user: user))
        }
        var original: (range: Range<Int>, named: Int)?
        if let job = retry.member("job") {
            guard case .object = job.value else {
                throw .wrongType(field: "retry.job", expected: "the original job", got: job.value.typeName)
            }
            func count(_ name: String) -> Int {
                if case .array(let items)? = job.value[name] { items.count } else { 0 }
            }
            original = (job.range, count("users") + count("tokens"))
        }
        return (attempt, targets, original)
    }

    private static func strings(_ value: JSONStrings?, named field: String) throws(JobError) -> [String] {
        switch value {
        case nil, .other(.null)?: return []
        case .strings(let strings)?: return strings
        case .notAString(let index, let typeName)?:
            throw .wrongType(field: "\(field)[\(index)]", expected: "a string", got: typeName)
        case .other(let other)?: throw .wrongType(field: field, expected: "an array of strings", got: other.typeName)
        }
    }
}
