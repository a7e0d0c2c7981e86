import APNs
import Configuration
import Testing
import WorkerPipeline

/// The token-cache value contract (`production`, `sandbox`, `<environment>:<topic>`) and which tokens a job reaches.
@Suite struct TokenScopeTests {
    @Test(arguments: [
        ("production", TokenScope(environment: .production)),
        ("sandbox", TokenScope(environment: .sandbox)),
        ("production:com.example.app.voip", TokenScope(environment: .production, topic: "com.example.app.voip")),
        ("sandbox:com.example.app.push-type.liveactivity",
         TokenScope(environment: .sandbox, topic: "com.example.app.push-type.liveactivity")),
        ("production:com.example.other", TokenScope(environment: .production, topic: "com.example.other")),
        ("production:com.apple.mgmt.External.6b0f6ac2-7a1c-4b8e-9a51-2f3c1d0e9b77",
         TokenScope(environment: .production, topic: "com.apple.mgmt.External.6b0f6ac2-7a1c-4b8e-9a51-2f3c1d0e9b77")),
    ])
    func cacheValuesReadAndWriteBack(value: String, scope: TokenScope) {
        #expect(TokenScope(cacheValue: value) == scope)
        #expect(scope.cacheValue == value)
    }

    @Test(arguments: ["", "Production", "staging", "production:", "sandbox: com.example.app", "test:com.example.app",
                      ":com.example.app", "production:com.example\u{0}app", "production:" + String(repeating: "a", count: 256),
                      "production:com.example.app:1", "production:com.example/app", "production:com..app"])
    func unreadableValuesAreRefused(value: String) {
        #expect(TokenScope(cacheValue: value) == nil)
    }

    @Test func withADefaultTopicPlainEntriesServeExactlyThatTopic() {
        let device = TokenScope(environment: .production)
        let voip = TokenScope(environment: .production, topic: "com.example.app.voip")
        let activity = TokenScope(environment: .sandbox, topic: "com.example.app.push-type.liveactivity")
        let other = TokenScope(environment: .production, topic: "com.example.other")
        func reached(_ topic: String) -> [TokenScope] {
            let matcher = TopicMatcher(topic: topic, defaultTopic: "com.example.app")
            return [device, voip, activity, other].filter(matcher.serves)
        }
        #expect(reached("com.example.app") == [device])
        #expect(reached("com.example.app.voip") == [voip])
        #expect(reached("com.example.app.push-type.liveactivity") == [activity])
        #expect(reached("com.example.other") == [other], "a sibling app's job never reaches the default app's tokens")
        #expect(reached("com.example.app.location-query") == [], "no token of that kind: nothing")
    }

    @Test func withoutADefaultTopicPlainEntriesServeAnyTopicWithoutAKindSuffix() {
        let device = TokenScope(environment: .production)
        func reaches(_ topic: String) -> Bool { TopicMatcher(topic: topic, defaultTopic: nil).serves(device) }
        #expect(reaches("com.example.app"), "caches written before topics keep working")
        #expect(reaches("com.example.other"))
        for pushType in APNsPushType.allCases where !pushType.topicSuffix.isEmpty {
            #expect(!reaches(pushType.topic(forBundle: "com.example.app")), "\(pushType) has tokens of its own")
        }
    }

    @Test func aRemovalNamesExactlyTheValuesItsTopicReaches() {
        let alert = TopicMatcher(topic: "com.example.app", defaultTopic: "com.example.app")
        #expect(alert.cacheValues(in: .production) == ["production:com.example.app", "production"])
        let voip = TopicMatcher(topic: "com.example.app.voip", defaultTopic: "com.example.app")
        #expect(voip.cacheValues(in: .sandbox) == ["sandbox:com.example.app.voip"])
    }

    @Test func deadTokenEventsRemoveOnlyWhatTheirTopicReaches() {
        func event(topic: String) -> DeadTokenEvent {
            DeadTokenEvent(token: "ab", user: "u", topic: topic, environment: .production, status: 410,
                           reason: "Unregistered", timestamp: 1, jobID: "j")
        }
        #expect(event(topic: "com.example.app.voip").cacheValuesItRemoves(defaultTopic: "com.example.app")
                == ["production:com.example.app.voip"])
        #expect(event(topic: "").cacheValuesItRemoves(defaultTopic: nil) == ["production"],
                "an event naming no topic is about the default app's device tokens")
        #expect(event(topic: "").cacheValuesItRemoves(defaultTopic: "com.example.app")
                == ["production", "production:com.example.app"])
    }
}

/// When 400 BadDeviceToken / DeviceTokenNotForTopic answers, in one job or across the fleet, are a configuration
/// error, not dead tokens.
@Suite struct MassInvalidationGuardTests {
    @Test(arguments: [
        (20, 20, true),    // every answer a mismatch, at the threshold
        (20, 199, true),   // more than a tenth
        (20, 200, false),  // exactly a tenth is not more
        (19, 19, false),   // under the threshold: treated as dead tokens
        (100, 150, true),
        (0, 0, false),
    ])
    func holdsBackAtLeastTheThresholdWhenMoreThanTheShare(mismatches: Int, judged: Int, holds: Bool) {
        #expect(MassInvalidationGuard(threshold: 20).holdsBack(InvalidationCounts(mismatches: mismatches, judged: judged))
                == holds)
    }

    @Test func onlyAnswersThatJudgeATokenCount() {
        #expect(MassInvalidationGuard.judgesToken(APNsResponse(status: 200)))
        #expect(MassInvalidationGuard.judgesToken(APNsResponse(status: 410, reason: .unregistered)))
        #expect(MassInvalidationGuard.judgesToken(APNsResponse(status: 400, reason: .deviceTokenNotForTopic)))
        #expect(!MassInvalidationGuard.judgesToken(APNsResponse(status: 429, reason: .tooManyRequests)))
        #expect(!MassInvalidationGuard.judgesToken(APNsResponse(status: 503)))
        #expect(!MassInvalidationGuard.judgesToken(APNsResponse(status: 400, reason: .badTopic)))
    }

    @Test func aJobOrTheFleetHoldsMismatchesBackAndAnUnreadableWindowRemovesNothing() {
        let guarding = MassInvalidationGuard(threshold: 20)
        let oneUser = InvalidationCounts(mismatches: 1, judged: 1)
        #expect(guarding.verdict(job: InvalidationCounts(judged: 5), fleet: nil) == .remove, "nothing to hold back")
        #expect(guarding.verdict(job: oneUser, fleet: InvalidationCounts(mismatches: 19, judged: 19)) == .remove)
        #expect(guarding.verdict(job: oneUser, fleet: InvalidationCounts(mismatches: 20, judged: 20)) == .heldBackByFleet)
        #expect(guarding.verdict(job: oneUser, fleet: InvalidationCounts(mismatches: 20, judged: 1000)) == .remove,
                "one bad token in fifty is genuine")
        #expect(guarding.verdict(job: oneUser, fleet: nil) == .heldBackByFleet)
        #expect(guarding.verdict(job: InvalidationCounts(mismatches: 20, judged: 40), fleet: InvalidationCounts()) == .heldBackByJob)
    }

    @Test func theThresholdAndTheShareAreSettings() throws {
        let environment = ["APNS_KEY_FILE": "", "WORKER_MASS_INVALIDATION_THRESHOLD": "5", "WORKER_MASS_INVALIDATION_SHARE": "0.3"]
        let configuration = try WorkerConfiguration.load(from: environment, requiringCredentials: false)
        #expect(configuration.pipeline.invalidationGuard == MassInvalidationGuard(threshold: 5, share: 0.3))
        #expect(try WorkerConfiguration.load(from: [:], requiringCredentials: false).pipeline.invalidationGuard
                == MassInvalidationGuard(threshold: 20, share: 0.1))
        #expect(throws: ConfigurationError.self) {
            try WorkerConfiguration.load(from: ["WORKER_MASS_INVALIDATION_THRESHOLD": "0"], requiringCredentials: false)
        }
        #expect(throws: ConfigurationError.self) {
            try WorkerConfiguration.load(from: ["WORKER_MASS_INVALIDATION_SHARE": "2"], requiringCredentials: false)
        }
    }

    @Test func onlyMismatchAnswersAreWeighed() {
        #expect(APNsOutcome.isTokenMismatch(APNsResponse(status: 400, reason: .badDeviceToken)))
        #expect(APNsOutcome.isTokenMismatch(APNsResponse(status: 400, reason: .deviceTokenNotForTopic)))
        #expect(!APNsOutcome.isTokenMismatch(APNsResponse(status: 410, reason: .unregistered, timestamp: 1)))
        #expect(!APNsOutcome.isTokenMismatch(APNsResponse(status: 400, reason: .badTopic)))
    }
}
