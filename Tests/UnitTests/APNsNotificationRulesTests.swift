import APNs
import Configuration
import Testing

@Suite struct APNsNotificationRulesTests {
    let token = String(repeating: "ab", count: 32)
    let payload = Array(#"{"aps":{"alert":"hi"}}"#.utf8)

    @Test func defaultsFollowApple() {
        #expect(APNsNotification(deviceToken: token, topic: "t", payload: payload).priority == .immediately)
        #expect(
            APNsNotification(deviceToken: token, topic: "t", pushType: .background, payload: payload).priority
                == .considerPower)
    }

    /// A job's notifications share their message (`sending(to:environment:)`): each has its own token and environment,
    /// the rest as the first's, and changing a field of one changes no other.
    @Test func notificationsOfOneMessageKeepTheirOwnTokenAndFields() throws {
        let first = APNsNotification(
            deviceToken: token, environment: .sandbox, topic: "com.example.app", pushType: .background,
            expiration: 60, collapseID: "score", payload: payload)
        let other = String(repeating: "cd", count: 32)
        var second = first.sending(to: other, environment: .production)
        #expect(second.deviceToken == other && second.environment == .production)
        #expect(first.deviceToken == token && first.environment == .sandbox)
        #expect(second.topic == "com.example.app" && second.pushType == .background)
        #expect(second.priority == .considerPower && second.expiration == 60 && second.collapseID == "score")
        #expect(second.payload == payload && second.apnsID == nil)
        #expect(second.sharesFields(with: first))
        second.collapseID = "other"
        second.payload = [1]
        #expect(first.collapseID == "score" && first.payload == payload, "the first keeps its own")
        #expect(second.collapseID == "other" && second.payload == [1])
        #expect(!second.sharesFields(with: first))
        try first.validate()
    }

    /// A token is scanned again unless its notification's maker says it checked it where the token came in; a copy
    /// to another token (`sending(to:environment:)`) is scanned unless its maker says so too.
    @Test func aTokenIsCheckedUnlessItsMakerCheckedIt() throws {
        let bad = "not-a-token"
        let unchecked = APNsNotification(deviceToken: bad, topic: "com.example.app", payload: payload)
        #expect(throws: APNsRequestError.self) { try unchecked.validate() }
        let checked = APNsNotification(
            deviceToken: token, topic: "com.example.app", payload: payload, deviceTokenChecked: true)
        try checked.validate()
        #expect(throws: APNsRequestError.self) {
            try checked.sending(to: bad, environment: .production).validateOwnFields()
        }
        try checked.sending(to: String(repeating: "cd", count: 32), environment: .sandbox, deviceTokenChecked: true)
            .validateOwnFields()
        // The maker's word is taken: the token is not scanned again (the worker's targets were, as they came in).
        try checked.sending(to: bad, environment: .production, deviceTokenChecked: true).validateOwnFields()
        var changed = checked
        changed.deviceToken = bad
        #expect(!changed.deviceTokenChecked, "a token set afterwards is checked again")
        #expect(throws: APNsRequestError.self) { try changed.validateOwnFields() }
    }

    @Test func topicSuffixesPerPushType() {
        #expect(APNsPushType.voip.topic(forBundle: "com.example.app") == "com.example.app.voip")
        #expect(
            APNsPushType.liveactivity.topic(forBundle: "com.example.app") == "com.example.app.push-type.liveactivity")
        #expect(APNsPushType.widgets.topic(forBundle: "com.example.app") == "com.example.app.push-type.widgets")
        #expect(APNsPushType.controls.topic(forBundle: "com.example.app") == "com.example.app.push-type.controls")
        #expect(APNsPushType.alert.topic(forBundle: "com.example.app") == "com.example.app")
        #expect(APNsPushType.voip.topic(forBundle: "com.example.app.voip") == "com.example.app.voip")
        #expect(APNsPushType.allCases.count == 11)
    }

    @Test func validationNamesTheBrokenRule() {
        func error(_ change: (inout APNsNotification) -> Void) -> APNsRequestError? {
            var notification = APNsNotification(deviceToken: token, topic: "com.example.app", payload: payload)
            change(&notification)
            do { try notification.validate() } catch { return error }
            return nil
        }
        #expect(error { _ in } == nil)
        #expect(error { $0.deviceToken = "xyz" } == .badDeviceToken(length: 3))
        #expect(error { $0.payload = [] } == .payloadEmpty)
        #expect(
            error { $0.payload = Array(repeating: 32, count: 4097) }
                == .payloadTooLarge(size: 4097, limit: 4096, pushType: .alert))
        #expect(
            error {
                $0.pushType = .voip
                $0.topic = "com.example.app.voip"
                $0.payload = Array(repeating: 32, count: 5000)
            } == nil)
        #expect(
            error {
                $0.pushType = .background
                $0.priority = .immediately
            } == .backgroundWithImmediatePriority)
        #expect(error { $0.collapseID = String(repeating: "c", count: 65) } == .collapseIDTooLong(65))
        #expect(error { $0.apnsID = "NOT-A-UUID" } == .badAPNsID("NOT-A-UUID"))
        #expect(error { $0.apnsID = "123e4567-e89b-12d3-a456-426614174000" } == nil)
        #expect(error { $0.pushType = .voip } == .topicMissingSuffix(topic: "com.example.app", pushType: .voip))
        #expect(error { $0.topic = "" } == .missingTopic)
        #expect(
            error { $0.topic = "com.example app" }
                == .badTopic("apns-topic", #"holds " ": a bundle ID is ASCII letters, digits, "-" and ".""#))
        #expect(
            error { $0.collapseID = "sale\r\nx: y" }
                == .badHeaderValue("apns-collapse-id", "holds control character 0xD"))
        #expect(error { $0.expiration = -1 } == .badExpiration(-1))
        #expect(error { $0.expiration = 0 } == nil, "0: try once, do not store")
        #expect(error { $0.expiration = 1_796_184_000 } == nil)
        #expect(error { $0.expiration = 1_796_184_000_000 } == .badExpiration(1_796_184_000_000), "milliseconds")
    }

    /// A topic is a bundle ID as Apple defines them (with a push type's suffix): a broadcast's path is built from
    /// it, and `/`, `?`, `#`, `%` or an empty part would change the request.
    @Test func aTopicIsABundleIDAndNothingThatCouldChangeAPath() {
        for topic in [
            "com.example.app", "com.example.app.voip", "com.example.app.push-type.liveactivity",
            "com.Example-1.app9", "a", String(repeating: "a", count: 255)
        ] {
            #expect(APNsRules.topicProblem(topic) == nil, "\(topic)")
        }
        for topic in [
            "com.example/../other", "com.example?x=1", "com.example#frag", "com.example%2Fother", "com..example",
            ".com.example", "com.example.", "com.exämple", "com.example\u{0}", "com_example", "com example",
            String(repeating: "a", count: 256)
        ] {
            #expect(APNsRules.topicProblem(topic) != nil, "\(topic.debugDescription)")
            #expect(throws: APNsRequestError.self) { try APNsRules.checkTopic(topic, field: "\"topic\"") }
        }
        #expect(
            APNsRules.topicProblem("com.ex/ample") == #"holds "/": a bundle ID is ASCII letters, digits, "-" and ".""#)
        #expect(APNsRules.topicProblem("com..example") == #"has an empty part (a leading, trailing or double ".")"#)
    }

    @Test func tokensAreHexOfAnyEvenLength() throws {
        try APNsNotification.validateDeviceToken(String(repeating: "0f", count: 50))
        try APNsNotification.validateDeviceToken(String(repeating: "0F", count: 100))
        #expect(throws: APNsRequestError.badDeviceToken(length: 3)) { try APNsNotification.validateDeviceToken("abc") }
        #expect(throws: APNsRequestError.badDeviceToken(length: 0)) { try APNsNotification.validateDeviceToken("") }
        #expect(throws: APNsRequestError.badDeviceToken(length: 2)) { try APNsNotification.validateDeviceToken("zz") }
        #expect(throws: APNsRequestError.badDeviceToken(length: 202)) {
            try APNsNotification.validateDeviceToken(String(repeating: "0f", count: 101))
        }
    }

    /// Every character at every position of a 64-byte token, and tokens of odd lengths: lowered exactly when an
    /// ASCII capital is in it (the check reads eight bytes at a time), untouched otherwise.
    @Test func canonicalTokensAreLowerCaseAndOnlyCapitalsChangeThem() {
        let base = String(repeating: "0a", count: 32)
        for value in UInt32(1)..<256 {
            let character = String(Character(Unicode.Scalar(value)!))
            for position in [0, 7, 8, 31, 63] {
                var characters = Array(base)
                characters[position] = Character(character)
                let token = String(characters)
                let expected = (65...90).contains(value) ? token.lowercased() : token
                #expect(APNsNotification.canonicalToken(token) == expected, "character \(value) at \(position)")
                #expect(
                    APNsNotification.isCanonicalToken(token) == (expected == token), "character \(value) at \(position)"
                )
            }
        }
        #expect(APNsNotification.canonicalToken("ABC") == "abc")
        #expect(
            APNsNotification.canonicalToken(String(repeating: "ab", count: 4) + "C") == String(
                repeating: "ab", count: 4) + "c")
    }

    /// The token check tells whether a token is lower-case already, for a capital in an eight-byte word the check
    /// reads at once and in the bytes past the last one.
    @Test func theTokenCheckTellsWhetherATokenIsLowerCase() throws {
        let base = Array(String(repeating: "0a", count: 33))
        for position in [0, 7, 8, 63, 64, 65] {
            for character in "0123456789abcdefABCDEF" {
                var characters = base
                characters[position] = character
                let lowerCase = try APNsNotification.validateDeviceToken(String(characters))
                #expect(lowerCase == !character.isUppercase, "\(character) at \(position)")
            }
        }
    }

    /// Every byte below 0x21 and 0x7F is found at every place of a value longer than the eight bytes read at once;
    /// the bytes of multi-byte characters are no problem.
    @Test func headerValueProblemsAreFoundAtEveryPlace() {
        for place in 0..<19 {
            for byte in Array(UInt8(0)...0x20) + [0x7F] {
                var bytes = Array("com.example.apps.xy".utf8)
                bytes[place] = byte
                let value = String(decoding: bytes, as: UTF8.self)
                #expect(
                    HeaderValue.problem(value, allowsInnerSpaces: false) != nil,
                    "0x\(String(byte, radix: 16)) at \(place)")
            }
        }
        #expect(HeaderValue.problem("com.ex\u{E4}mple.\u{E4}pp.\u{FC}n\u{EF}code", allowsInnerSpaces: false) == nil)
        #expect(HeaderValue.problem("summer sale of 2026", allowsInnerSpaces: true) == nil)
        #expect(HeaderValue.problem("summer sale of 2026 ", allowsInnerSpaces: true) == "starts or ends with a space")
    }

    /// Notifications sharing a validated one's fields (push type, priority, expiration, topic, collapse-id) have only
    /// their own checked: device token, apns-id and payload; any other difference means a whole validation again
    /// (the client's shortcut for the notifications of a job, and for the single-notification jobs of one sender).
    @Test func onlyTheTokenApnsIDAndPayloadDifferAmongNotificationsSharingFields() {
        let first = APNsNotification(deviceToken: token, topic: "com.example.app", payload: payload)
        var second = first
        second.deviceToken = String(repeating: "cd", count: 32)
        second.payload = Array(#"{"aps":{"alert":"another"}}"#.utf8)
        #expect(second.sharesFields(with: first))
        second.deviceToken = "xyz"
        #expect(throws: APNsRequestError.badDeviceToken(length: 3)) { try second.validateOwnFields() }
        second.apnsID = "NOT-A-UUID"
        second.deviceToken = token
        #expect(throws: APNsRequestError.badAPNsID("NOT-A-UUID")) { try second.validateOwnFields() }
        second.apnsID = nil
        second.payload = []
        #expect(throws: APNsRequestError.payloadEmpty) { try second.validateOwnFields() }
        second.payload = Array(repeating: 0x20, count: 4097)
        #expect(throws: APNsRequestError.payloadTooLarge(size: 4097, limit: 4096, pushType: .alert)) {
            try second.validateOwnFields()
        }
        for change in [
            { (n: inout APNsNotification) in n.topic = "com.example.other" },
            { $0.priority = .considerPower }, { $0.expiration = 5 }, { $0.collapseID = "c" },
            { $0.pushType = .background }
        ] as [(inout APNsNotification) -> Void] {
            var other = first
            change(&other)
            #expect(!other.sharesFields(with: first))
        }
    }

    /// Every ASCII character, and a few beyond, at every place of a token (eight bytes are checked at once, the
    /// rest one by one): exactly 0-9, a-f and A-F make a token (the checks are bit tricks).
    @Test func onlyHexDigitsMakeAToken() {
        let hex = Set("0123456789abcdefABCDEF".unicodeScalars.map(\.value))
        for value in UInt32(0)..<256 {
            let character = String(Character(Unicode.Scalar(value)!))
            for place in [0, 1, 7, 8, 13, 16, 21] {
                let token = String(repeating: "a", count: place) + character + String(repeating: "F", count: 21 - place)
                if hex.contains(value) {
                    #expect(throws: Never.self, "character \(value) at \(place)") {
                        try APNsNotification.validateDeviceToken(token)
                    }
                } else {
                    #expect(
                        throws: APNsRequestError.badDeviceToken(length: token.utf8.count),
                        "character \(value) at \(place)"
                    ) {
                        try APNsNotification.validateDeviceToken(token)
                    }
                }
            }
        }
    }

    @Test func endpointsParse() throws {
        #expect(try APNsEndpoint(url: "https://api.push.apple.com") == .production)
        #expect(
            try APNsEndpoint(url: "https://api.sandbox.push.apple.com:2197")
                == APNsEndpoint(host: "api.sandbox.push.apple.com", port: 2197))
        #expect(try APNsEndpoint(url: "https://[::1]:8443/") == APNsEndpoint(host: "::1", port: 8443))
        #expect(throws: APNsConfigurationError.self) { try APNsEndpoint(url: "http://api.push.apple.com") }
        #expect(throws: APNsConfigurationError.self) { try APNsEndpoint(url: "https://host:99999") }
    }
}
