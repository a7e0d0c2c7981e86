import APNsModel

/// Which device tokens a job reaches: its own tokens, then those of its users' cached tokens that serve its topic,
/// each token once (whatever its case), less what an earlier delivery of the same job already settled.
///
/// A user's tokens of other kinds (a VoIP token for an alert, another app's token) are never reached; a device named
/// twice, or sitting under two users of a cache other systems feed, is sent to once.
public struct TargetResolver: Sendable, Equatable {
    /// The topic of jobs that name none, and the app whose plain cache entries serve it.
    public var defaultTopic: String?

    public init(defaultTopic: String?) {
        self.defaultTopic = defaultTopic
    }

    /// Jobs that name themselves (an `id` in the body, or a message-id) can be recognised when redelivered; a
    /// delivery tag changes with every delivery.
    public static func hasStableID(_ job: PushJob, _ delivery: JobDelivery) -> Bool {
        job.idFromBody || delivery.properties.idForJob != nil
    }

    /// The users whose cache entries the store must resolve for these jobs (a retry carries its targets resolved);
    /// of a job with more than `piece` users, the first piece only.
    public func usersToResolve(_ jobs: [PushJob]) -> [String] {
        // Only jobs with users add theirs: adding an empty array still took the array's growth path, for every job.
        var users: [String] = []
        for job in jobs where job.retryTargets == nil && !job.users.isEmpty { users.append(contentsOf: job.users) }
        return users
    }

    /// Whether an earlier delivery or copy of this job may have settled some of its notifications: redelivered, or
    /// published again by its publisher after a failover (`Worker.republishedHeader`).
    public static func mayRepeat(_ delivery: JobDelivery) -> Bool {
        delivery.redelivered || delivery.properties.headers.contains(Worker.republishedHeader)
    }

    /// The jobs whose earlier deliveries or copies may have settled some notifications already, with a stable id.
    public func jobsToLookUp(_ jobs: [(delivery: JobDelivery, job: PushJob)]) -> [String] {
        jobs.filter { Self.mayRepeat($0.delivery) && Self.hasStableID($0.job, $0.delivery) }.map(\.job.id)
    }

    /// A job's targets, as `targets(of:resolved:activityTokens:alreadySettled:)` makes them; a job that reaches only
    /// its own tokens, each once, and none already settled, keeps them as they are (`DeviceTargets`).
    public func deviceTargets(
        of job: PushJob, resolved: ResolvedTokens, activityTokens: ArraySlice<CachedToken> = [],
        alreadySettled: Set<String> = []
    ) -> (targets: DeviceTargets, skipped: Int) {
        if job.users.isEmpty && job.retryTargets == nil && activityTokens.isEmpty && alreadySettled.isEmpty
            && !Self.mayHoldOneTokenTwice(job.tokens)
        {
            return (DeviceTargets(ownTokensOf: job), 0)
        }
        let (targets, skipped) = targets(
            of: job, resolved: resolved, activityTokens: activityTokens, alreadySettled: alreadySettled)
        return (DeviceTargets(targets), skipped)
    }

    /// A job's targets, and how many were skipped as already settled by an earlier delivery.
    /// `activityTokens`: the update tokens of the Live Activity the job addresses, if it does; those that serve the
    /// job's topic are reached (with no user: a dead one leaves with its activity, not from a user's cache).
    public func targets(
        of job: PushJob, resolved: ResolvedTokens, activityTokens: ArraySlice<CachedToken> = [],
        alreadySettled: Set<String> = []
    ) -> (targets: [DeviceTarget], skipped: Int) {
        var targets = job.retryTargets ?? newTargets(of: job, resolved: resolved)
        if job.retryTargets == nil && !activityTokens.isEmpty {
            let matcher = TopicMatcher(topic: job.topic, defaultTopic: defaultTopic)
            var seen = Set(targets.map(\.token))
            for cached in activityTokens where matcher.serves(cached.scope) {
                if seen.insert(cached.token).inserted {
                    targets.append(DeviceTarget(token: cached.token, environment: cached.scope.environment, user: nil))
                }
            }
        }
        guard !alreadySettled.isEmpty else { return (targets, 0) }
        let before = targets.count
        targets.removeAll { alreadySettled.contains($0.token) }
        return (targets, before - targets.count)
    }

    /// One piece of a large job's targets (`JobAssembly`): its own tokens with the first piece, then these users'
    /// tokens; `firstTime` says whether a token is reached for the first time in the whole job.
    public func pieceTargets(
        of job: PushJob, users: ArraySlice<String>, withOwnTokens: Bool,
        resolved: ResolvedTokens, alreadySettled: Set<String>,
        firstTime: (String) -> Bool
    ) -> (targets: [DeviceTarget], skipped: Int) {
        var targets = collect(job, users: users, withOwnTokens: withOwnTokens, resolved: resolved, firstTime: firstTime)
        guard !alreadySettled.isEmpty else { return (targets, 0) }
        let before = targets.count
        targets.removeAll { alreadySettled.contains($0.token) }
        return (targets, before - targets.count)
    }

    private func newTargets(of job: PushJob, resolved: ResolvedTokens) -> [DeviceTarget] {
        // Collected as they come, then told apart only when two of them may be one device: most jobs name each
        // device once, and a word per target in a table on the stack costs a fraction of a set insertion each. The
        // set hashes whole tokens, so that tokens made alike in their sampled words cost it no more than any others.
        let targets = collect(job, users: job.users[...], withOwnTokens: true, resolved: resolved) { _ in true }
        guard Self.mayHoldOneTokenTwice(targets.lazy.map(\.token)) else { return targets }
        var seen = Set<String>(minimumCapacity: targets.count)
        return targets.filter { seen.insert($0.token).inserted }
    }

    /// Whether two of `tokens` may be one token: two of their keys (`tokenKey`) are equal. Equal tokens
    /// always have equal keys; different tokens almost never do, and when they do (by chance, or made to), comparing
    /// the tokens whole tells them apart.
    ///
    /// The keys go into an open-addressed table of at least twice their number (a power of two), a key's slot taken
    /// from the top bits of its product with an odd constant (Fibonacci hashing: a short token's key, its bytes as
    /// they are, is spread as well as a long one's) and the next free slot after it on a collision: no allocation for
    /// a job's tokens, one probe or two per key.
    static func mayHoldOneTokenTwice(_ tokens: some Collection<String>) -> Bool {
        guard tokens.count > 1 else { return false }
        let slots = 1 << (Int.bitWidth - (tokens.count * 2 - 1).leadingZeroBitCount)
        let shift = UInt64(Int.bitWidth - slots.trailingZeroBitCount)
        return withUnsafeTemporaryAllocation(of: UInt64.self, capacity: slots) { table in
            // Zero marks a free slot; a key's lowest bit is set, so that none is zero (two keys that differ only there
            // are taken for equal: the whole tokens are compared then).
            table.initialize(repeating: 0)
            for token in tokens {
                let key = tokenKey(token) | 1
                var slot = Int(truncatingIfNeeded: (key &* 0x9E37_79B9_7F4A_7C15) >> shift)
                while table[slot] != 0 {
                    if table[slot] == key { return true }
                    slot = (slot + 1) & (slots - 1)
                }
                table[slot] = key
            }
            return false
        }
    }

    /// A word made of a token's bytes: its first, middle and last eight bytes, each multiplied by an odd constant of
    /// its own (so that swapped or repeated words do not cancel out), and its length; a token under eight bytes
    /// whole, its length in the top byte. Tokens are random hex: these bytes tell them apart as well as all of theirs.
    static func tokenKey(_ token: String) -> UInt64 {
        token.withUTF8Bytes { bytes in
            guard bytes.count >= 8 else { return bytes.reduce(0) { $0 << 8 | UInt64($1) } | UInt64(bytes.count) << 56 }
            let raw = UnsafeRawBufferPointer(bytes)
            let first = raw.loadUnaligned(fromByteOffset: 0, as: UInt64.self)
            let middle = raw.loadUnaligned(fromByteOffset: (bytes.count - 8) / 2, as: UInt64.self)
            let last = raw.loadUnaligned(fromByteOffset: bytes.count - 8, as: UInt64.self)
            return (first &* 0x9E37_79B9_7F4A_7C15) ^ (middle &* 0xBF58_476D_1CE4_E5B9)
                ^ (last &* 0x94D0_49BB_1331_11EB) ^ UInt64(bytes.count)
        }
    }

    private func collect(
        _ job: PushJob, users: ArraySlice<String>, withOwnTokens: Bool,
        resolved: ResolvedTokens, firstTime: (String) -> Bool
    ) -> [DeviceTarget] {
        let matcher = TopicMatcher(topic: job.topic, defaultTopic: defaultTopic)
        var targets: [DeviceTarget] = []
        targets.reserveCapacity((withOwnTokens ? job.tokens.count : 0) + users.count)
        if withOwnTokens {
            for token in job.tokens where firstTime(token) {
                targets.append(DeviceTarget(token: token, environment: job.environment, user: nil))
            }
        }
        // Spellings of one token in two cases (written by other systems) are one device: sent to once, lower-case
        // (a cached token is, `CachedToken`).
        for user in users {
            for cached in resolved[user] ?? [] where matcher.serves(cached.scope) {
                guard firstTime(cached.token) else { continue }
                targets.append(DeviceTarget(token: cached.token, environment: cached.scope.environment, user: user))
            }
        }
        return targets
    }
}
