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
        (
            "sandbox:com.example.app.push-type.liveactivity",
            TokenScope(environment: .sandbox, topic: "com.example.app.push-type.liveactivity")
        ),
        ("production:com.example.other", TokenScope(environment: .production, topic: "com.example.other")),
        (
            "production:com.apple.mgmt.External.6b0f6ac2-7a1c-4b8e-9a51-2f3c1d0e9b77",
            TokenScope(environment: .production, topic: "com.apple.mgmt.External.6b0f6ac2-7a1c-4b8e-9a51-2f3c1d0e9b77")
        )
    ])
    func cacheValuesReadAndWriteBack(value: String, scope: TokenScope) {
        #expect(TokenScope(cacheValue: value) == scope)
        #expect(scope.cacheValue == value)
    }

    @Test(arguments: [
        "", "Production", "staging", "production:", "sandbox: com.example.app", "test:com.example.app",
        ":com.example.app", "production:com.example\u{0}app", "production:" + String(repeating: "a", count: 256),
        "production:com.example.app:1", "production:com.example/app", "production:com..app"
    ])
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
            DeadTokenEvent(
                token: "ab", user: "u", topic: topic, environment: .production, status: 410,
                reason: "Unregistered", timestamp: 1, jobID: "j")
        }
        #expect(
            event(topic: "com.example.app.voip").cacheValuesItRemoves(defaultTopic: "com.example.app")
                == ["production:com.example.app.voip"])
        #expect(
            event(topic: "").cacheValuesItRemoves(defaultTopic: nil) == ["production"],
            "an event naming no topic is about the default app's device tokens")
        #expect(
            event(topic: "").cacheValuesItRemoves(defaultTopic: "com.example.app")
                == ["production", "production:com.example.app"])
    }
}
