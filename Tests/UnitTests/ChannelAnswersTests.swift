import Testing

@testable import APNs

/// The channel management API's answers, read as Apple documents them; anything else is unexpected and named,
/// never echoed (the ids go to an operator's terminal).
@Suite struct ChannelAnswersTests {
    private func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

    @Test func aListIsChannelIdsOrUnexpected() throws {
        #expect(
            try APNsChannelAnswer.channels(bytes(#"{"channels": ["dHdvIHdvcmRzCg==", "b25lIG1vcmU="]}"#))
                == ["dHdvIHdvcmRzCg==", "b25lIG1vcmU="])
        #expect(try APNsChannelAnswer.channels(bytes(#"{"channels": []}"#)) == [])
        #expect(throws: APNsChannelError.unexpected("item 2 of \"channels\" is no channel id")) {
            try APNsChannelAnswer.channels(bytes(#"{"channels": ["dHdvIHdvcmRzCg==", "\u001b[2J"]}"#))
        }
        #expect(throws: APNsChannelError.unexpected("item 1 of \"channels\" is no channel id")) {
            try APNsChannelAnswer.channels(bytes(#"{"channels": [7]}"#))
        }
        #expect(throws: APNsChannelError.unexpected("no \"channels\" list in the answer")) {
            try APNsChannelAnswer.channels(bytes(#"{"channels": "dHdvIHdvcmRzCg=="}"#))
        }
    }

    @Test func aCreatedChannelsIdIsAChannelId() throws {
        #expect(try APNsChannelAnswer.createdChannel("dHdvIHdvcmRzCg==") == "dHdvIHdvcmRzCg==")
        #expect(throws: APNsChannelError.unexpected("201 without apns-channel-id")) {
            try APNsChannelAnswer.createdChannel(nil)
        }
        #expect(throws: APNsChannelError.unexpected("201 with an apns-channel-id that is no channel id")) {
            try APNsChannelAnswer.createdChannel("not base64 at all!")
        }
    }

    @Test func aStoragePolicyIsZeroOrOne() throws {
        #expect(try APNsChannelAnswer.storage(bytes(#"{"message-storage-policy": 1}"#)) == .mostRecent)
        #expect(try APNsChannelAnswer.storage(bytes(#"{"message-storage-policy": 0}"#)) == .none)
        for body in [
            #"{"message-storage-policy": 2}"#, #"{"message-storage-policy": 1e400}"#,
            #"{"message-storage-policy": "1"}"#, "[]"
        ] {
            #expect(throws: APNsChannelError.self, "\(body)") { try APNsChannelAnswer.storage(bytes(body)) }
        }
    }

    @Test func aRefusalCarriesApplesReason() {
        #expect(
            APNsChannelAnswer.refusal(status: 400, body: bytes(#"{"reason": "BadChannelId"}"#))
                == .refused(status: 400, reason: "BadChannelId"))
        #expect(APNsChannelAnswer.refusal(status: 500, body: bytes("<html>")) == .refused(status: 500, reason: nil))
        // What a server says reaches an operator's terminal: no escape sequence, and a bounded length.
        let hostile = APNsChannelAnswer.refusal(
            status: 400, body: bytes(#"{"reason": "\u001b]2;owned\u0007Bad\#(String(repeating: "x", count: 500))"}"#))
        guard case .refused(400, let reason?) = hostile else {
            Issue.record("not a refusal with a reason: \(hostile)")
            return
        }
        #expect(!reason.unicodeScalars.contains { $0.value < 0x20 } && reason.count <= 81, "\(reason)")
    }
}
