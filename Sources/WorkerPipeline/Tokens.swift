import APNsModel

/// A device token to send to, and whom it belongs to.
public struct DeviceTarget: Sendable, Equatable {
    public var token: String
    public var environment: APNsEnvironment
    /// nil for tokens a job named directly.
    // `Optional<T>` (CodeShapeTests.valuesMadePerJobSpellTheirOptionalsOut says why).
    public var user: Optional<String>

    public init(token: String, environment: APNsEnvironment, user: String?) {
        self.token = token
        self.environment = environment
        self.user = user
    }
}

/// One token of a user's cache entry, with what it serves. The token is as the project keeps tokens, lower-case hex
/// (`APNsNotification.canonicalToken`), whatever case its entry was written in: spellings of one token in two cases
/// (written by other systems) are one device.
public struct CachedToken: Sendable, Equatable {
    public var token: String
    public var scope: TokenScope

    public init(token: String, scope: TokenScope) {
        self.init(canonical: APNsNotification.canonicalToken(token), scope: scope)
    }

    /// A token its store found lower-case already as it read it (`APNsNotification.scanDeviceToken`): not scanned
    /// again, on the path every cached token of every job takes.
    package init(canonical token: String, scope: TokenScope) {
        self.token = token
        self.scope = scope
    }
}

/// What one removal or registration did to the cache. A failure is the store refusing it for this entry's keys (a key
/// of the wrong type that another system wrote): a data error about one user, never a reason to stop the rest.
public enum CacheChange: Sendable, Equatable {
    case applied
    /// Nothing to do: a removal found the token gone, registered again since, or registered for another topic or
    /// environment; a registration was older than what is known.
    case unchanged
    case failed(String)
    /// The Redis node holding the entry did not answer (a cluster master lost): nothing changed.
    case unavailable
}

/// Users' tokens (or Live Activities' update tokens, by activity id), with the entries Redis could not read (a key of
/// the wrong type: their jobs skip them) and those whose node did not answer (their jobs wait: nothing is known of
/// them).
public struct ResolvedUsers: Sendable {
    public var tokens: ResolvedTokens
    /// user -> the store's error.
    public var unreadable: [String: String]
    /// Entries on a Redis node that did not answer (a cluster master lost).
    public var unavailable: Set<String>

    public init(tokens: ResolvedTokens, unreadable: [String: String] = [:], unavailable: Set<String> = []) {
        self.tokens = tokens
        self.unreadable = unreadable
        self.unavailable = unavailable
    }
}

/// Takes one token out of the cache, if what is known of it still says so.
public struct TokenRemoval: Sendable, Equatable {
    /// "" for a token sent directly: its owner (`apns:owner:<token>`), if known.
    public var user: String
    public var token: String
    /// Kept if registered again after this (ms): the time APNs learned the token died, or a logout's. nil
    /// (an operator's removal) removes whatever its registration time.
    public var unlessRegisteredAfter: Int64?
    /// The cache values the entry must hold (`TopicMatcher.cacheValues`): an answer about one topic and environment
    /// leaves a token registered for another alone. nil removes whatever the entry serves (logouts, operators).
    public var onlyIfValueIn: [String]?
    /// A Live Activity's update token: removed from that activity's tokens, not from a user's (`user` is "").
    public var activity: String?

    public init(
        user: String, token: String, unlessRegisteredAfter: Int64? = nil, onlyIfValueIn: [String]? = nil,
        activity: String? = nil
    ) {
        self.activity = activity
        self.user = user
        self.token = token
        self.unlessRegisteredAfter = unlessRegisteredAfter
        self.onlyIfValueIn = onlyIfValueIn
    }
}

/// A token as the app reported it at launch (a registration event, or `apns-worker tokens add`).
public struct TokenRegistration: Sendable, Equatable {
    public var user: String
    public var token: String
    /// Its environment, and the topic it was issued for (nil: a device token of the default app).
    public var scope: TokenScope
    /// ms since epoch.
    public var registeredAt: Int64
    /// Device metadata (model, OS and app versions, locale, ...) as a JSON object, kept as sent.
    public var deviceJSON: String?
    /// A Live Activity's update token: the activity it updates. Such a token is kept under the activity
    /// (`"activity": "<id>"` in a job reaches it), not among the user's tokens, and expires with the activity.
    public var activity: String?
    /// The user's time zone (an IANA name, `TimeZoneName`), kept with the user for jobs with a `local_window`.
    public var timeZone: String?

    public init(
        user: String, token: String, scope: TokenScope, registeredAt: Int64, deviceJSON: String? = nil,
        activity: String? = nil, timeZone: String? = nil
    ) {
        self.activity = activity
        self.timeZone = timeZone
        self.user = user
        self.token = token
        self.scope = scope
        self.registeredAt = registeredAt
        self.deviceJSON = deviceJSON
    }
}
