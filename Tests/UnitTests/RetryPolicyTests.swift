import Testing
import WorkerPipeline

@Suite struct RetryPolicyTests {
    let policy = RetryPolicy(maximumAttempts: 3, delays: [1, 15, 60, 300])

    @Test func eachAttemptWaitsItsTierAndTheLastTierRepeats() {
        #expect((1...6).map { policy.delay(attempt: $0, suggestedDelay: 0) } == [1, 15, 60, 300, 300, 300])
    }

    @Test func aLongerWaitAPNsSuggestsTakesTheTierThatCoversIt() {
        #expect(policy.delay(attempt: 1, suggestedDelay: 15) == 15)
        #expect(policy.delay(attempt: 1, suggestedDelay: 16) == 60)
        #expect(policy.delay(attempt: 1, suggestedDelay: 10_000) == 300, "never beyond the longest tier")
        #expect(policy.delay(attempt: 3, suggestedDelay: 1) == 60, "a shorter suggestion does not shorten the tier")
    }

    @Test func retriesWhileAttemptsRemainThenParks() {
        #expect(policy.decide(attempt: 1, retryable: 2, suggestedDelay: 0, deadline: nil, now: 0) == .retry(delay: 1))
        #expect(policy.decide(attempt: 2, retryable: 2, suggestedDelay: 0, deadline: nil, now: 0) == .retry(delay: 15))
        #expect(policy.decide(attempt: 3, retryable: 2, suggestedDelay: 0, deadline: nil, now: 0) == .park)
        #expect(
            policy.decide(attempt: 3, retryable: 0, suggestedDelay: 0, deadline: nil, now: 0) == .none,
            "a job with nothing to retry is neither retried nor parked")
    }

    @Test func aRetryThatWouldComeAfterTheDeadlineExpiresInstead() {
        #expect(
            policy.decide(attempt: 1, retryable: 1, suggestedDelay: 0, deadline: 1_000, now: 998) == .retry(delay: 1))
        #expect(policy.decide(attempt: 1, retryable: 1, suggestedDelay: 0, deadline: 1_000, now: 999) == .expire)
        #expect(
            policy.decide(attempt: 3, retryable: 1, suggestedDelay: 0, deadline: 1_000, now: 999.5) == .expire,
            "on the last attempt too: a job past its deadline is not parked for people to send again")
    }

    @Test func delaysAreTakenShortestFirst() {
        let unsorted = RetryPolicy(maximumAttempts: 3, delays: [60, 1])
        #expect(unsorted.delays == [1, 60])
        #expect(RetryPolicy(maximumAttempts: 3, delays: []).delays == [1])
    }
}
