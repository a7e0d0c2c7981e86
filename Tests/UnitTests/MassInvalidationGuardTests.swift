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

    /// The fleet's window over one span: the last minute's and the last hour's counts alike.
    static func fleet(_ mismatches: Int, _ judged: Int) -> FleetInvalidationCounts {
        let counts = InvalidationCounts(mismatches: mismatches, judged: judged)
        return FleetInvalidationCounts(lastMinute: counts, lastHour: counts)
    }

    @Test func aJobOrTheFleetHoldsMismatchesBackAndAnUnreadableWindowRemovesNothing() {
        let guarding = MassInvalidationGuard(threshold: 20)
        let oneUser = InvalidationCounts(mismatches: 1, judged: 1)
        #expect(guarding.verdict(job: InvalidationCounts(judged: 5), fleet: nil) == .remove, "nothing to hold back")
        #expect(guarding.verdict(job: oneUser, fleet: Self.fleet(19, 19)) == .remove)
        #expect(guarding.verdict(job: oneUser, fleet: Self.fleet(20, 20)) == .heldBackByFleet)
        #expect(
            guarding.verdict(job: oneUser, fleet: Self.fleet(20, 1000)) == .remove, "one bad token in fifty is genuine")
        #expect(guarding.verdict(job: oneUser, fleet: nil) == .heldBackByFleet)
        #expect(
            guarding.verdict(job: InvalidationCounts(mismatches: 20, judged: 40), fleet: Self.fleet(0, 0))
                == .heldBackByJob)
    }

    /// A wave slower than the threshold a minute (a misconfigured fleet with little traffic: 18 one-user jobs a
    /// minute, every one a BadDeviceToken) never fills the minute's window; the hour's holds it back once it reaches
    /// the threshold, and a healthy hour's answers dilute a genuine bad token now and then.
    @Test func aSlowWaveIsHeldBackByTheHoursWindow() {
        let guarding = MassInvalidationGuard(threshold: 20)
        let oneUser = InvalidationCounts(mismatches: 1, judged: 1)
        let minute = InvalidationCounts(mismatches: 18, judged: 18)
        let slowWave = FleetInvalidationCounts(
            lastMinute: minute, lastHour: InvalidationCounts(mismatches: 36, judged: 36))
        #expect(guarding.verdict(job: oneUser, fleet: slowWave) == .heldBackByFleet)
        let healthyHour = FleetInvalidationCounts(
            lastMinute: InvalidationCounts(mismatches: 1, judged: 50),
            lastHour: InvalidationCounts(mismatches: 30, judged: 3000))
        #expect(guarding.verdict(job: oneUser, fleet: healthyHour) == .remove)
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
