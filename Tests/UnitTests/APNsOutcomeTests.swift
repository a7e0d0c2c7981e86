import APNs
import Configuration
import Testing

@Suite struct APNsOutcomeTests {
    @Test(
        arguments: [
            (200, nil, APNsOutcome.delivered),
            (410, "Unregistered", .deadToken),
            (410, "ExpiredToken", .deadToken),
            (400, "BadDeviceToken", .deadToken),
            (400, "DeviceTokenNotForTopic", .deadToken),
            (400, "BadCollapseId", .permanentFailure),
            (400, "TopicDisallowed", .permanentFailure),
            (403, "ExpiredProviderToken", .refreshTokenAndRetry),
            (403, "InvalidProviderToken", .permanentFailure),
            (403, "UnrelatedKeyIdInToken", .replaceConnectionAndRetry),
            (403, "BadEnvironmentKeyIdInToken", .replaceConnectionAndRetry),
            (413, "PayloadTooLarge", .permanentFailure),
            (429, "TooManyRequests", .retryLater(delay: 60)),
            (429, "TooManyProviderTokenUpdates", .retryLater(delay: 5)),
            (500, "InternalServerError", .retryLater(delay: 15)),
            (503, "ServiceUnavailable", .retryLater(delay: 15)),
            (503, "SomethingAppleAddsLater", .retryLater(delay: 15)),
            (404, "BadPath", .permanentFailure)
        ] as [(Int, String?, APNsOutcome)])
    func classifiesEveryDocumentedAnswer(status: Int, reason: String?, expected: APNsOutcome) {
        let response = APNsResponse(status: status, reason: reason.map(APNsReason.init))
        #expect(APNsOutcome.classify(response) == expected)
    }

    /// Each route reads its answers with its own table: a dead token exists only on the device route, and a channel
    /// call succeeds with the status its call answers when it did what was asked.
    @Test(
        arguments: [
            (APNsRoute.device(token: "aa"), 410, "Unregistered", APNsOutcome.deadToken),
            (.device(token: "aa"), 400, "BadDeviceToken", .deadToken),
            (.broadcast(bundle: "com.example.app"), 410, "Unregistered", .permanentFailure),
            (.broadcast(bundle: "com.example.app"), 400, "BadDeviceToken", .permanentFailure),
            (.broadcast(bundle: "com.example.app"), 200, nil, .delivered),
            (.broadcast(bundle: "com.example.app"), 429, "TooManyRequests", .retryLater(delay: 60)),
            (.broadcast(bundle: "com.example.app"), 403, "ExpiredProviderToken", .refreshTokenAndRetry),
            (.channels(bundle: "com.example.app", .create), 201, nil, .delivered),
            (.channels(bundle: "com.example.app", .create), 200, nil, .permanentFailure),
            (.channels(bundle: "com.example.app", .delete), 204, nil, .delivered),
            (.channels(bundle: "com.example.app", .read), 410, "Unregistered", .permanentFailure),
            (.channels(bundle: "com.example.app", .list), 503, "ServiceUnavailable", .retryLater(delay: 15))
        ] as [(APNsRoute, Int, String?, APNsOutcome)])
    func eachRouteReadsAnswersWithItsOwnTable(route: APNsRoute, status: Int, reason: String?, expected: APNsOutcome) {
        #expect(route.outcome(of: APNsResponse(status: status, reason: reason.map(APNsReason.init))) == expected)
    }

    @Test func routesAreBuiltFromCheckedParts() throws {
        #expect(APNsRoute.device(token: "ab").path == ("/3/device/", "ab"))
        #expect(APNsRoute.broadcast(bundle: "com.example.app").method == "POST")
        #expect(APNsRoute.channels(bundle: "com.example.app", .list).path.rest == "com.example.app/all-channels")
        #expect(APNsRoute.channels(bundle: "com.example.app", .delete).method == "DELETE")
        for bundle in ["com.example/app", "com.example?x", "com.example#x", "com.example%2Fx", "com..example"] {
            #expect(throws: APNsRequestError.self, "\(bundle)") { try APNsRoute.broadcast(bundle: bundle).validate() }
        }
        #expect(throws: APNsRequestError.self) { try APNsRoute.device(token: "zz/..").validate() }
        try APNsRoute.broadcast(bundle: "com.example-app.scores").validate()
    }

    @Test func readsReasonAndMillisecondTimestampFromBody() {
        let body = Array(#"{"reason":"Unregistered","timestamp":1732900000123}"#.utf8)
        let parsed = APNsResponse.parseBody(body)
        #expect(parsed.reason == .unregistered)
        #expect(parsed.timestamp == 1_732_900_000_123)
    }

    @Test func unknownReasonIsKeptAndBadBodiesAreNotFatal() {
        #expect(
            APNsResponse.parseBody(Array(#"{"reason":"BrandNewReason"}"#.utf8)).reason?.rawValue == "BrandNewReason")
        #expect(APNsResponse.parseBody(Array("<html>".utf8)).reason == nil)
        #expect(APNsResponse.parseBody([]).reason == nil)
    }
}
