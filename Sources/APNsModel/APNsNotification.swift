/// One push to one device token, checked against Apple's rules before anything is sent.
public struct APNsNotification: Sendable {
    /// Setting it makes `deviceTokenChecked` false: the new token is checked, unless its setter sets that again.
    @inlinable public var deviceToken: String {
        _read { yield storedDeviceToken }
        set {
            storedDeviceToken = newValue
            deviceTokenChecked = false
        }
    }
    @usableFromInline var storedDeviceToken: String
    /// Where the token belongs: it is sent to that environment's host.
    public var environment: APNsEnvironment
    /// Whoever made the notification checked its token where the token came in (`validateDeviceToken` or
    /// `scanDeviceToken`, as a job is decoded or a cache entry read): `validate()` does not scan it again, on the
    /// path every notification takes. Made false by `sending(to:environment:)` unless it says otherwise.
    public var deviceTokenChecked: Bool
    /// Everything but the token and its environment, which a job's notifications have in common, in a box they
    /// share (`NotificationMessage`).
    @usableFromInline var message: NotificationMessage

    @usableFromInline
    package struct Message: Sendable, Equatable {
        // Optional fields spelled `Optional<T>` (CodeShapeTests.valuesMadePerJobSpellTheirOptionalsOut says why).
        @usableFromInline package var topic: String
        @usableFromInline package var pushType: APNsPushType
        @usableFromInline package var priority: APNsPriority
        @usableFromInline package var expiration: Optional<Int64>
        @usableFromInline package var collapseID: Optional<String>
        @usableFromInline package var apnsID: Optional<String>
        @usableFromInline package var payload: ArraySlice<UInt8>
        @usableFromInline package var sendBy: Optional<Int64>

        @inlinable
        package init(
            topic: String, pushType: APNsPushType, priority: APNsPriority, expiration: Int64?, collapseID: String?,
            apnsID: String?, payload: ArraySlice<UInt8>, sendBy: Int64?
        ) {
            self.topic = topic
            self.pushType = pushType
            self.priority = priority
            self.expiration = expiration
            self.collapseID = collapseID
            self.apnsID = apnsID
            self.payload = payload
            self.sendBy = sendBy
        }
    }

    @inlinable public var topic: String {
        _read { yield message.fields.topic }
        set { changeMessage { $0.topic = newValue } }
    }
    @inlinable public var pushType: APNsPushType {
        _read { yield message.fields.pushType }
        set { changeMessage { $0.pushType = newValue } }
    }
    @inlinable public var priority: APNsPriority {
        _read { yield message.fields.priority }
        set { changeMessage { $0.priority = newValue } }
    }
    /// UNIX seconds; 0 means "try once, do not store"; nil leaves storage to Apple.
    @inlinable public var expiration: Int64? {
        _read { yield message.fields.expiration }
        set { changeMessage { $0.expiration = newValue } }
    }
    @inlinable public var collapseID: String? {
        _read { yield message.fields.collapseID }
        set { changeMessage { $0.collapseID = newValue } }
    }
    /// Canonical lowercase UUID; APNs makes one when absent.
    @inlinable public var apnsID: String? {
        _read { yield message.fields.apnsID }
        set { changeMessage { $0.apnsID = newValue } }
    }
    /// UNIX seconds: not sent once this time has come (a job's `deadline`), however far it got on its way; nil for
    /// none. Not a field of the request: nothing of it reaches APNs.
    @inlinable public var sendBy: Int64? {
        _read { yield message.fields.sendBy }
        set { changeMessage { $0.sendBy = newValue } }
    }
    /// The JSON payload, encoded once per job and shared by all of its notifications.
    @inlinable public var payload: [UInt8] {
        get { Array(message.fields.payload) }
        set { changeMessage { $0.payload = newValue[...] } }
    }
    /// `payload` where it is kept: a job's notifications read theirs where the job's body holds it.
    @inlinable public var payloadBytes: ArraySlice<UInt8> {
        _read { yield message.fields.payload }
    }

    /// Inlinable, as are the fields: the worker makes and reads every notification from other modules, where a call
    /// would cost more than the work.
    @inlinable
    public init(
        deviceToken: String, environment: APNsEnvironment = .production, topic: String,
        pushType: APNsPushType = .alert, priority: APNsPriority? = nil, expiration: Int64? = nil,
        collapseID: String? = nil, apnsID: String? = nil, payload: [UInt8], sendBy: Int64? = nil,
        deviceTokenChecked: Bool = false
    ) {
        storedDeviceToken = deviceToken
        self.environment = environment
        self.deviceTokenChecked = deviceTokenChecked
        message = NotificationMessage(
            fields: Message(
                topic: topic, pushType: pushType, priority: priority ?? pushType.defaultPriority,
                expiration: expiration, collapseID: collapseID, apnsID: apnsID, payload: payload[...], sendBy: sendBy))
    }

    /// This notification's message to another device token: every other field shared with this one, not copied.
    @inlinable
    public func sending(
        to deviceToken: String, environment: APNsEnvironment, deviceTokenChecked: Bool = false
    ) -> APNsNotification {
        APNsNotification(
            deviceToken: deviceToken, environment: environment, sharingMessageOf: self,
            deviceTokenChecked: deviceTokenChecked)
    }

    /// A notification to `deviceToken` whose other fields are `sibling`'s, shared (`sending(to:environment:)`):
    /// only the shared box is counted once more, where copying `sibling` first counted its token too.
    @inlinable
    init(
        deviceToken: String, environment: APNsEnvironment, sharingMessageOf sibling: borrowing APNsNotification,
        deviceTokenChecked: Bool = false
    ) {
        storedDeviceToken = deviceToken
        self.environment = environment
        self.deviceTokenChecked = deviceTokenChecked
        message = sibling.message
    }

    /// A notification to `deviceToken` with the fields in `message`, shared: a job's notifications share its box
    /// (`PushJobStorage`).
    @inlinable
    package init(
        deviceToken: String, environment: APNsEnvironment, message: NotificationMessage, deviceTokenChecked: Bool
    ) {
        storedDeviceToken = deviceToken
        self.environment = environment
        self.deviceTokenChecked = deviceTokenChecked
        self.message = message
    }

    /// Changes the shared fields in place when this notification alone holds their box, in a copy of them otherwise
    /// (a copy of the fields alone: the box may be a job's).
    @inlinable mutating func changeMessage(_ apply: (inout Message) -> Void) {
        if !isKnownUniquelyReferenced(&message) { message = NotificationMessage(fields: message.fields) }
        apply(&message.fields)
    }

    /// Throws the first rule this notification breaks, in words that name it.
    public func validate() throws(APNsRequestError) {
        try validateOwnFields()
        try APNsRules.checkTopic(topic, field: "apns-topic")
        try APNsRules.checkPriority(priority, for: pushType)
        if let collapseID { try APNsRules.checkCollapseID(collapseID, field: "apns-collapse-id") }
        if let expiration { try APNsRules.checkExpiration(expiration) }
        try APNsRules.checkTopicSuffix(topic, for: pushType)
    }

    /// What `validate()` checks of this notification's own fields (its device token, apns-id and payload), for a
    /// notification whose other fields are those of one already validated (`sharesFields(with:)`): the notifications
    /// of one job differ only there, and so do single-notification jobs of one sender, so checking their topic and
    /// options once is enough.
    public func validateOwnFields() throws(APNsRequestError) {
        if !deviceTokenChecked { try Self.validateDeviceToken(deviceToken) }
        if let apnsID, !Self.isCanonicalUUID(apnsID) { throw .badAPNsID(apnsID) }
        if payloadBytes.isEmpty { throw .payloadEmpty }
        try APNsRules.checkPayloadSize(payloadBytes.count, for: pushType)
    }

    /// Whether every field that `validateOwnFields()` does not check (push type, priority, expiration, topic,
    /// collapse-id) is the same as `other`'s.
    public func sharesFields(with other: APNsNotification) -> Bool {
        if message === other.message { return true }
        return pushType == other.pushType && priority == other.priority && expiration == other.expiration
            && topic == other.topic && collapseID == other.collapseID
    }

    /// Device tokens are hex of no fixed length (Apple warns against assuming 64 characters). Returns whether the
    /// token is as the project keeps it already (no upper-case digit, as `isCanonicalToken`), found in the same pass.
    @discardableResult
    public static func validateDeviceToken(_ token: String) throws(APNsRequestError) -> Bool {
        var token = token
        // Contiguous UTF-8 makes this a plain byte loop (it is on the per-notification path).
        let (valid, hasUpperCase) = token.withUTF8 { scanDeviceToken(UnsafeRawBufferPointer($0)) }
        guard valid else { throw .badDeviceToken(length: token.utf8.count) }
        return !hasUpperCase
    }

    /// Whether `bytes` are a device token (`validateDeviceToken`), and whether one of its digits is upper-case: read in
    /// place, eight bytes at a time (a token read from the cache is checked before any string is made of it).
    public static func scanDeviceToken(_ bytes: UnsafeRawBufferPointer) -> (valid: Bool, hasUpperCase: Bool) {
        guard !bytes.isEmpty, bytes.count <= 200, bytes.count % 2 == 0 else { return (false, false) }
        var index = 0
        var upper: UInt64 = 0
        while index + 8 <= bytes.count {
            let word = bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self)
            guard allHexDigits(word) else { return (false, false) }
            // Among hex digits, A-F alone have 0x40 set and 0x20 clear (0-9 lack 0x40, a-f have both); the shift
            // moves each byte's 0x20 onto its own 0x40, never into the next byte.
            upper |= word & 0x4040_4040_4040_4040 & ~((word & 0x2020_2020_2020_2020) << 1)
            index += 8
        }
        for byte in bytes[index...] {
            guard isHexDigit(byte) else { return (false, false) }
            if byte &- UInt8(ascii: "A") < 6 { upper = 1 }
        }
        return (true, upper != 0)
    }

    /// A device token as the project keeps it: lower-case hex. Apple's tokens are case-insensitive hex, and one
    /// device's token written in two cases would be two cache entries and two pushes. No copy when already lower.
    public static func canonicalToken(_ token: String) -> String {
        isCanonicalToken(token) ? token : token.lowercased()
    }

    /// Whether `token` is as the project keeps it already (no upper-case letter): `canonicalToken` returns it as it is.
    public static func isCanonicalToken(_ token: String) -> Bool {
        var token = token
        // Over contiguous UTF-8, eight bytes at a time (the per-notification path): a byte in A...Z sets its top bit
        // in `(b + 0x3F) & ~(b + 0x25)` (b + 0x3F reaches 0x80 from "A" on, b + 0x25 from "[" on); bytes of 0x80 and
        // above, never upper-case ASCII, are masked out first so that no carry crosses into the next byte.
        let hasUpperCase = token.withUTF8 { bytes -> Bool in
            var index = 0
            let raw = UnsafeRawBufferPointer(bytes)
            while index + 8 <= bytes.count {
                let word = raw.loadUnaligned(fromByteOffset: index, as: UInt64.self)
                let ascii = word & 0x7F7F_7F7F_7F7F_7F7F
                let upper = (ascii &+ 0x3F3F_3F3F_3F3F_3F3F) & ~(ascii &+ 0x2525_2525_2525_2525) & ~word
                if upper & 0x8080_8080_8080_8080 != 0 { return true }
                index += 8
            }
            return bytes[index...].contains { $0 &- UInt8(ascii: "A") < 26 }
        }
        return !hasUpperCase
    }

    /// Whether the eight bytes of `word` are all hex digits, tested side by side: with every byte ASCII, adding a
    /// constant to each carries into no other, so `(x + 0x80 - low) & ~(x + 0x7F - high)` has its top bit set exactly
    /// when low <= x <= high (0-9, then a-f once letters are lowered with | 0x20, as `isHexDigit`).
    static func allHexDigits(_ word: UInt64) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let top = ones &* 0x80
        guard word & top == 0 else { return false }
        let lowered = word | (ones &* 0x20)
        let digits = (word &+ ones &* (0x80 - 0x30)) & ~(word &+ ones &* (0x7F - 0x39))
        let letters = (lowered &+ ones &* (0x80 - 0x61)) & ~(lowered &+ ones &* (0x7F - 0x66))
        return (digits | letters) & top == top
    }

    static func isHexDigit(_ byte: UInt8) -> Bool {
        // 0-9, or a-f once ASCII letters are lowered (| 0x20 maps A-F onto a-f and nothing else onto them).
        byte &- 48 < 10 || (byte | 0x20) &- 97 < 6
    }

    /// 8-4-4-4-12 lowercase hex.
    public static func isCanonicalUUID(_ value: String) -> Bool {
        let bytes = Array(value.utf8)
        guard bytes.count == 36 else { return false }
        for (index, byte) in bytes.enumerated() {
            if [8, 13, 18, 23].contains(index) {
                if byte != UInt8(ascii: "-") { return false }
            } else if !((byte >= 48 && byte <= 57) || (byte >= 97 && byte <= 102)) {
                return false
            }
        }
        return true
    }
}

/// A notification that breaks one of Apple's rules: caught here, before APNs sees it.
public enum APNsRequestError: Error, Sendable, Equatable, CustomStringConvertible {
    case badDeviceToken(length: Int)
    case missingTopic
    case payloadEmpty
    case payloadTooLarge(size: Int, limit: Int, pushType: APNsPushType)
    case backgroundWithImmediatePriority
    case liveActivityLowestPriority
    case collapseIDTooLong(Int)
    case badExpiration(Int64)
    case badAPNsID(String)
    case topicMissingSuffix(topic: String, pushType: APNsPushType)
    case badHeaderValue(String, String)
    /// A topic that is not a bundle ID (with its push type's suffix): the field and what is wrong.
    case badTopic(String, String)
    /// A broadcast's channel id that is not one (Apple's are base64).
    case badChannelID(String)

    public var description: String {
        switch self {
        case .badDeviceToken(let length):
            "device token is not an even-length hex string of 2...200 characters (got \(length) characters)"
        case .missingTopic: "no topic"
        case .payloadEmpty: "payload is empty"
        case .payloadTooLarge(let size, let limit, let pushType):
            "payload is \(size) bytes, over the \(limit)-byte limit for push_type \(pushType)"
        case .backgroundWithImmediatePriority: "background pushes must use priority 5 or 1, not 10"
        case .liveActivityLowestPriority: "Live Activity pushes must use priority 10 or 5, not 1"
        case .collapseIDTooLong(let length): "collapse_id is \(length) bytes, over the 64-byte limit"
        case .badExpiration(let value):
            value < 0
                ? "expiration \(value) must be UNIX seconds, 0 or later"
                : "expiration \(value) is beyond \(APNsRules.latestSecondsText): give UNIX seconds, not milliseconds"
        case .badAPNsID(let value): "apns-id \(value) is not a canonical lowercase UUID"
        case .badHeaderValue(let field, let problem): "\(field) \(problem): it is sent as an HTTP/2 header"
        case .badTopic(let field, let problem): "\(field) \(problem)"
        case .badChannelID(let id): "channel id \"\(id.prefix(80))\" is not base64, as Apple's channel ids are"
        case .topicMissingSuffix(let topic, let pushType):
            "topic \(topic) lacks the \(pushType.topicSuffix) suffix that push type \(pushType) requires"
        }
    }
}
