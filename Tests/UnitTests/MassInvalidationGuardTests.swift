import APNs
import Configuration
import Testing
import WorkerPipeline

/// When 400 BadDeviceToken / DeviceTokenNotForTopic answers, in one job or across the fleet, are a configuration
/// error, not dead tokens.
@Suite struct MassInvalidationGuardTests {
    @Test(arguments: [
        (20, 20, true),  // every answer a mismatch, at the threshold
        (20, 199, true),  // more than a tenth
        (20, 200, false),  // exactly a tenth is not more
        (19, 19, false),  // under the threshold: treated as dead tokens
        (100, 150, true),
        (0, 0, false)
    ])
    func holdsBackAtLeastTheThresholdWhenMoreThanTheShare(mismatches: Int, judged: Int, holds: Bool) {
        #expect(
            MassInvalidationGuard(threshold: 20).holdsBack(InvalidationCounts(mismatches: mismatches, judged: judged))
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
        #expect(
            guarding.verdict(job: oneUser, fleet: InvalidationCounts(mismatches: 20, judged: 20)) == .heldBackByFleet)
        #expect(
            guarding.verdict(job: oneUser, fleet: InvalidationCounts(mismatches: 20, judged: 1000)) == .remove,
            "one bad token in fifty is genuine")
        #expect(guarding.verdict(job: oneUser, fleet: nil) == .heldBackByFleet)
        #expect(
            guarding.verdict(job: InvalidationCounts(mismatches: 20, judged: 40), fleet: InvalidationCounts())
                == .heldBackByJob)
    }

    @Test func theThresholdAndTheShareAreSettings() throws {
        let environment = [
            "APNS_KEY_FILE": "", "WORKER_MASS_INVALIDATION_THRESHOLD": "5", "WORKER_MASS_INVALIDATION_SHARE": "0.3"
        ]
        let configuration = try WorkerConfiguration.load(from: environment, requiringCredentials: false)
        #expect(configuration.pipeline.invalidationGuard == MassInvalidationGuard(threshold: 5, share: 0.3))
        #expect(
            try WorkerConfiguration.load(from: [:], requiringCredentials: false).pipeline.invalidationGuard
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
