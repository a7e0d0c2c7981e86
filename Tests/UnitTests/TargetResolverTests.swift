import APNs
import Testing
import WorkerPipeline

@Suite struct TargetResolverTests {
    static let topic = "com.example.app"
    let resolver = TargetResolver(defaultTopic: topic)

    static func token(_ number: Int) -> String { String(format: "%064x", number) }

    func job(users: [String] = [], tokens: [String] = [], pushType: String = "alert", topic: String = topic) throws
        -> PushJob
    {
        let users = users.map { "\"\($0)\"" }.joined(separator: ",")
        let tokens = tokens.map { "\"\($0)\"" }.joined(separator: ",")
        let body =
            #"{"id":"j","topic":"\#(topic)","push_type":"\#(pushType)","users":[\#(users)],"tokens":[\#(tokens)],"payload":{"aps":{}}}"#
        return try PushJob.decode(Array(body.utf8), defaultTopic: Self.topic, fallbackID: "-")
    }

    @Test func aJobsOwnTokensThenItsUsersTokensEachOnce() throws {
        let resolved: ResolvedTokens = [
            "alice": [
                CachedToken(token: Self.token(2), scope: TokenScope(environment: .sandbox)),
                CachedToken(token: Self.token(1), scope: TokenScope(environment: .production))
            ],
            "bob": [CachedToken(token: Self.token(2), scope: TokenScope(environment: .sandbox))]
        ]
        let (targets, skipped) = resolver.targets(
            of: try job(users: ["alice", "bob"], tokens: [Self.token(1)]),
            resolved: resolved)
        #expect(
            targets == [
                DeviceTarget(token: Self.token(1), environment: .production, user: nil),
                DeviceTarget(token: Self.token(2), environment: .sandbox, user: "alice")
            ])
        #expect(skipped == 0)
    }

    /// Tokens alike in the bytes their keys are made of (start, middle, end) and different elsewhere are two
    /// devices; the same token twice is one.
    @Test func tokensDifferingOnlyBetweenTheirHashedWordsAreTwoTargets() throws {
        let first = String(repeating: "ab", count: 32)
        var bytes = Array(first.utf8)
        bytes[10] = UInt8(ascii: "c")
        let second = String(decoding: bytes, as: UTF8.self)
        let resolved: ResolvedTokens = [
            "alice": [CachedToken(token: second, scope: TokenScope(environment: .production))]
        ]
        let (targets, _) = resolver.targets(of: try job(users: ["alice"], tokens: [first, first]), resolved: resolved)
        #expect(targets.map(\.token) == [first, second])
    }

    /// A thousand users' tokens, one of them also the job's own and one user's twice: each device once, wherever in
    /// the job its second mention falls, and no other token lost.
    @Test func aRepeatAmongAThousandTargetsIsOneTarget() throws {
        let users = (0..<1000).map { "user-\($0)" }
        var resolved = Dictionary(
            uniqueKeysWithValues: users.enumerated().map { index, user in
                (user, [CachedToken(token: Self.token(100 + index), scope: TokenScope(environment: .production))])
            })
        resolved["user-999"]?.append(CachedToken(token: Self.token(100), scope: TokenScope(environment: .production)))
        let (targets, _) = resolver.targets(
            of: try job(users: users, tokens: [Self.token(600)]), resolved: ResolvedTokens(resolved))
        #expect(targets.count == 1000)
        #expect(Set(targets.map(\.token)) == Set((100..<1100).map(Self.token)))
        #expect(targets.first { $0.token == Self.token(600) }?.user == nil, "the job's own mention comes first")
    }

    /// Tokens shorter than the words a token's key samples (as short as two hex digits) are told apart as surely.
    @Test func shortTokensNamedTwiceAreOneTargetEach() throws {
        let short = ["ab", "0a0b", "0a0b0c0d0e", "0a0b0c0d0e0f"]
        let resolved: ResolvedTokens = [
            "alice": short.map { CachedToken(token: $0, scope: TokenScope(environment: .production)) }
        ]
        let (targets, _) = resolver.targets(of: try job(users: ["alice"], tokens: short), resolved: resolved)
        #expect(targets.map(\.token) == short)
        #expect(targets.allSatisfy { $0.user == nil }, "each the job's own, first named")
    }

    @Test func aUsersTokensOfAnotherKindOrAppAreNeverReached() throws {
        let resolved: ResolvedTokens = [
            "alice": [
                CachedToken(token: Self.token(1), scope: TokenScope(environment: .production)),
                CachedToken(
                    token: Self.token(2), scope: TokenScope(environment: .production, topic: "com.example.app.voip")),
                CachedToken(token: Self.token(3), scope: TokenScope(environment: .production, topic: "com.other.app"))
            ]
        ]
        #expect(
            resolver.targets(of: try job(users: ["alice"]), resolved: resolved).targets.map(\.token) == [Self.token(1)])
        let voip = try job(users: ["alice"], pushType: "voip", topic: "com.example.app.voip")
        #expect(resolver.targets(of: voip, resolved: resolved).targets.map(\.token) == [Self.token(2)])
    }

    @Test func whatAnEarlierDeliverySettledIsSkippedAndCounted() throws {
        let (targets, skipped) = resolver.targets(
            of: try job(tokens: [Self.token(1), Self.token(2)]), resolved: [:],
            alreadySettled: [Self.token(1)])
        #expect(targets.map(\.token) == [Self.token(2)])
        #expect(skipped == 1)
    }

    @Test func aRetryGoesToExactlyItsTargetsWithoutResolvingUsers() throws {
        let original = try job(users: ["alice"])
        let target = DeviceTarget(token: Self.token(5), environment: .sandbox, user: "alice")
        let retry = try PushJob.decode(
            original.retryBody(targets: [target], original: Array("{}".utf8)),
            defaultTopic: Self.topic, fallbackID: "-")
        #expect(resolver.usersToResolve([original, retry]) == ["alice"], "only the new job's users are looked up")
        let reached = resolver.targets(
            of: retry,
            resolved: [
                "alice": [
                    CachedToken(
                        token: Self.token(6),
                        scope: TokenScope(environment: .production))
                ]
            ])
        #expect(reached.targets == [target])
    }

    /// What the pipeline keeps for a job (`deviceTargets`) is what `targets` reaches, whether the job's own tokens are
    /// kept as they are (its own tokens alone, each once, none settled) or made into targets.
    @Test func theTargetsKeptForAJobAreTheOnesItReaches() throws {
        let resolved: ResolvedTokens = [
            "alice": [CachedToken(token: Self.token(3), scope: TokenScope(environment: .production))]
        ]
        let sandbox = try PushJob.decode(
            Array(#"{"id":"s","environment":"sandbox","tokens":["\#(Self.token(1))"],"payload":{"aps":{}}}"#.utf8),
            defaultTopic: Self.topic, fallbackID: "-")
        let cases: [(job: PushJob, settled: Set<String>)] = [
            (try job(tokens: [Self.token(1)]), []), (sandbox, []),
            (try job(tokens: [Self.token(1), Self.token(2)]), []),
            (try job(tokens: [Self.token(1), Self.token(2), Self.token(1)]), []),
            (try job(users: ["alice"], tokens: [Self.token(1)]), []),
            (try job(tokens: [Self.token(1), Self.token(2)]), [Self.token(1)])
        ]
        for (job, settled) in cases {
            let kept = resolver.deviceTargets(of: job, resolved: resolved, alreadySettled: settled)
            let reached = resolver.targets(of: job, resolved: resolved, alreadySettled: settled)
            #expect(Array(kept.targets) == reached.targets, "tokens \(job.tokens), users \(job.users)")
            #expect(kept.skipped == reached.skipped)
        }
        #expect(
            Array(resolver.deviceTargets(of: sandbox, resolved: [:]).targets)
                == [DeviceTarget(token: Self.token(1), environment: .sandbox, user: nil)])
    }

    @Test func onlyRedeliveredJobsWithAStableIDAreLookedUp() throws {
        let named = try job(tokens: [Self.token(1)])
        // The same job without an id of its own: named by the fallback its delivery gave it.
        let unnamed = try PushJob.decode(
            Array(#"{"tokens":["\#(Self.token(1))"],"payload":{"aps":{}}}"#.utf8),
            defaultTopic: Self.topic, fallbackID: "j")
        #expect(unnamed.id == "j" && !unnamed.idFromBody)
        let first = JobDelivery(tag: 1, redelivered: false, body: [], properties: MessageProperties())
        let again = JobDelivery(tag: 2, redelivered: true, body: [], properties: MessageProperties())
        let againWithMessageID = JobDelivery(
            tag: 3, redelivered: true, body: [], properties: MessageProperties(messageID: "m"))
        #expect(resolver.jobsToLookUp([(first, named)]).isEmpty, "a first delivery has no history")
        #expect(resolver.jobsToLookUp([(again, named)]) == ["j"])
        #expect(resolver.jobsToLookUp([(again, unnamed)]).isEmpty, "a delivery tag names no job across deliveries")
        #expect(resolver.jobsToLookUp([(againWithMessageID, unnamed)]) == ["j"])
    }

    @Test func spellingsOfOneTokenInTwoCasesAreOneLowerCaseTarget() throws {
        let lower = Self.token(0xabc)
        let upper = lower.uppercased()
        let resolved: ResolvedTokens = [
            "alice": [
                CachedToken(token: upper, scope: TokenScope(environment: .production)),
                CachedToken(token: lower, scope: TokenScope(environment: .production))
            ]
        ]
        let reached = resolver.targets(of: try job(users: ["alice"], tokens: [upper]), resolved: resolved).targets
        #expect(reached.map(\.token) == [lower], "one device, one push, in lower case")
    }
}
