import APNsModel

/// What one cached token serves: the environment it lives in and the topic it was issued for. This is the value of
/// a field of `apns:tokens:<user>` (the contract in README.md):
/// - `production` or `sandbox`: a device token of the default app (APNS_TOPIC), for alert and background pushes;
/// - `<environment>:<topic>`: a token issued for exactly that topic, the push type's suffix included, e.g.
///   `production:com.example.app.voip` (a PushKit token) or `sandbox:com.example.app.push-type.liveactivity`.
///
/// A device token serves one topic: APNs answers DeviceTokenNotForTopic for any other, so a job must never reach
/// the tokens of another kind or another app.
public struct TokenScope: Sendable, Hashable, CustomStringConvertible {
    public var environment: APNsEnvironment
    /// nil: the default app's device token (a plain `production` or `sandbox` value).
    public var topic: String?

    public init(environment: APNsEnvironment, topic: String? = nil) {
        self.environment = environment
        self.topic = topic
    }

    /// Reads a cache value; nil for anything else (other systems feed the cache, and their mistakes are skipped,
    /// never guessed at).
    public init?(cacheValue: String) {
        if let environment = APNsEnvironment(rawValue: cacheValue) {
            self.init(environment: environment)
            return
        }
        guard let colon = cacheValue.firstIndex(of: ":"),
              let environment = APNsEnvironment(rawValue: String(cacheValue[..<colon])) else { return nil }
        let topic = cacheValue[cacheValue.index(after: colon)...]
        guard Self.isValidTopic(topic) else { return nil }
        self.init(environment: environment, topic: String(topic))
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
