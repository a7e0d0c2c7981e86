import APNsModel

/// What one cached token serves: the environment it lives in and the topic it was issued for. This is the value of
/// a field of `apns:tokens:<user>` (the contract in docs/contract.md):
/// - `production` or `sandbox`: a device token of the default app (APNS_TOPIC), for alert and background pushes;
/// - `<environment>:<topic>`: a token issued for exactly that topic, the push type's suffix included, e.g.
///   `production:com.example.app.voip` (a PushKit token) or `sandbox:com.example.app.push-type.liveactivity`.
///
/// A device token serves one topic: APNs answers DeviceTokenNotForTopic for any other, so a job must never reach
/// the tokens of another kind or another app.
public struct TokenScope: Sendable, Hashable, CustomStringConvertible {
    public var environment: APNsEnvironment
    /// nil: the default app's device token (a plain `production` or `sandbox` value).
    // `Optional<T>` (CodeShapeTests.valuesMadePerJobSpellTheirOptionalsOut says why).
    public var topic: Optional<String>

    public init(environment: APNsEnvironment, topic: String? = nil) {
        self.environment = environment
        self.topic = topic
    }

    /// Reads a cache value; nil for anything else (other systems feed the cache, and their mistakes are skipped,
    /// never guessed at).
    public init?(cacheValue: String) {
        var value = cacheValue
        guard let scope = value.withUTF8({ TokenScope(cacheValue: UnsafeRawBufferPointer($0)) }) else { return nil }
        self = scope
    }

    /// Reads a cache value from its bytes, in place: the plain values (most of the cache) make no string at all.
    public init?(cacheValue bytes: UnsafeRawBufferPointer) {
        if let environment = Self.environment(bytes) {
            self.init(environment: environment)
            return
        }
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")),
            let environment = Self.environment(UnsafeRawBufferPointer(rebasing: bytes[..<colon]))
        else { return nil }
        let topic = String(decoding: bytes[(colon + 1)...], as: UTF8.self)
        guard Self.isValidTopic(topic) else { return nil }
        self.init(environment: environment, topic: topic)
    }

    private static func environment(_ bytes: UnsafeRawBufferPointer) -> APNsEnvironment? {
        // Compared as words: the value of nearly every cached token, read once per token resolved.
        switch bytes.count {
        case 10
        where bytes.loadUnaligned(as: UInt64.self) == 0x6974_6375_646f_7270  // "producti"
            && bytes.loadUnaligned(fromByteOffset: 8, as: UInt16.self) == 0x6e6f:  // "on"
            return .production
        case 7
        where bytes.loadUnaligned(as: UInt32.self) == 0x646e_6173  // "sand"
            && bytes.loadUnaligned(fromByteOffset: 4, as: UInt16.self) == 0x6f62 && bytes[6] == UInt8(ascii: "x"):
            return .sandbox
        default:
            return nil
        }
    }

    /// The value written to the cache.
    public var cacheValue: String { topic.map { environment.rawValue + ":" + $0 } ?? environment.rawValue }

    public var description: String { cacheValue }

    /// A topic a token can be registered for: a bundle ID with its push type's suffix, as a job's topic must be
    /// (`APNsRules.checkTopic`).
    public static func isValidTopic(_ topic: some StringProtocol) -> Bool {
        !topic.isEmpty && APNsRules.topicProblem(topic) == nil
    }
}

/// Which cached tokens a job reaches: the tokens registered for its effective topic (its topic with the push type's
/// suffix), and the default app's device tokens when that topic is the default app's.
public struct TopicMatcher: Sendable, Equatable {
    /// The job's effective topic.
    public let topic: String
    /// Whether plain `production`/`sandbox` entries serve this topic: it is APNS_TOPIC; or, where APNS_TOPIC is not
    /// set (caches written before tokens recorded their topic), it carries no push type's token-kind suffix.
    public let servesDefaultAppTokens: Bool

    public init(topic: String, defaultTopic: String?) {
        self.topic = topic
        if let defaultTopic {
            servesDefaultAppTokens = topic == defaultTopic
        } else {
            servesDefaultAppTokens = !APNsPushType.hasTokenKindSuffix(topic)
        }
    }

    public func serves(_ scope: TokenScope) -> Bool {
        guard let tokenTopic = scope.topic else { return servesDefaultAppTokens }
        return tokenTopic == topic
    }

    /// The cache values an entry of `environment` holds when this topic reaches it: what a removal for this topic
    /// requires to find, so that an answer about one kind of token never removes a token of another kind.
    public func cacheValues(in environment: APNsEnvironment) -> [String] {
        let scoped = TokenScope(environment: environment, topic: topic).cacheValue
        return servesDefaultAppTokens ? [scoped, environment.rawValue] : [scoped]
    }
}
