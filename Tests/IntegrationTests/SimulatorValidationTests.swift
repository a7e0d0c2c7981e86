import APNs
import APNsSimulator
import Foundation
import HTTP2
import Synchronization
import Telemetry
import Testing

#if canImport(Glibc)
    import Glibc
    import Threads
#endif

/// apns-sim judges raw requests like APNs: each broken rule gets Apple's status and reason.
@Suite struct SimulatorValidationTests {
    let logger = Logger(label: "sim", level: .critical)
    static let token = String(repeating: "7f", count: 32)

    struct Case: Sendable, CustomStringConvertible {
        var name: String
        var method = "POST"
        var path = "/3/device/\(SimulatorValidationTests.token)"
        var headers: [(String, String)] = [("apns-topic", "com.example.app"), ("apns-push-type", "alert")]
        var body = #"{"aps":{"alert":"hi"}}"#
        var status: Int
        var reason: String?
        var description: String { name }
    }

    static let cases: [Case] =
        [
            Case(name: "valid", status: 200),
            Case(name: "GET", method: "GET", status: 405, reason: "MethodNotAllowed"),
            Case(name: "bad path", path: "/2/device/abcd", status: 404, reason: "BadPath"),
            Case(name: "no token", path: "/3/device/", status: 400, reason: "MissingDeviceToken"),
            Case(name: "non-hex token", path: "/3/device/zz", status: 400, reason: "BadDeviceToken"),
            Case(name: "no topic", headers: [("apns-push-type", "alert")], status: 400, reason: "MissingTopic"),
            Case(
                name: "unknown push type", headers: [("apns-topic", "t"), ("apns-push-type", "smoke")], status: 400,
                reason: "InvalidPushType"),
            Case(
                name: "voip without suffix", headers: [("apns-topic", "com.example.app"), ("apns-push-type", "voip")],
                status: 400, reason: "BadTopic"),
            Case(
                name: "priority 7", headers: [("apns-topic", "t"), ("apns-priority", "7")], status: 400,
                reason: "BadPriority"),
            Case(
                name: "background at 10",
                headers: [("apns-topic", "t"), ("apns-push-type", "background"), ("apns-priority", "10")],
                status: 400, reason: "BadPriority"),
            Case(
                name: "background at 5",
                headers: [("apns-topic", "t"), ("apns-push-type", "background"), ("apns-priority", "5")],
                status: 200),
            Case(
                name: "uppercase apns-id",
                headers: [("apns-topic", "t"), ("apns-id", "123E4567-E89B-12D3-A456-426614174000")],
                status: 400, reason: "BadMessageId"),
            Case(
                name: "long collapse id",
                headers: [("apns-topic", "t"), ("apns-collapse-id", String(repeating: "c", count: 65))],
                status: 400, reason: "BadCollapseId"),
            Case(
                name: "bad expiration", headers: [("apns-topic", "t"), ("apns-expiration", "tomorrow")], status: 400,
                reason: "BadExpirationDate"),
            Case(name: "empty payload", body: "", status: 400, reason: "PayloadEmpty"),
            Case(
                name: "payload over 4096", body: #"{"a":""# + String(repeating: "x", count: 4100) + #""}"#, status: 413,
                reason: "PayloadTooLarge"),
            Case(
                name: "voip payload of 5000", headers: [("apns-topic", "t.voip"), ("apns-push-type", "voip")],
                body: #"{"a":""# + String(repeating: "x", count: 5000) + #""}"#, status: 200),
            Case(name: "payload not JSON", body: "hello", status: 400, reason: "BadPayload"),
            Case(name: "payload a JSON array", body: #"[{"aps":{}}]"#, status: 400, reason: "BadPayload"),
            Case(
                name: "payload broken inside", body: #"{"aps":{"alert":"hi","badge":tru}}"#, status: 400,
                reason: "BadPayload"),
            Case(name: "payload repeating a key", body: #"{"aps":{"alert":"a","alert":"b"}}"#, status: 200),
            Case(name: "priority 1", headers: [("apns-topic", "t"), ("apns-priority", "1")], status: 200),
            Case(
                name: "mdm takes the topic as it is",
                headers: [("apns-topic", "com.apple.mgmt.External.x"), ("apns-push-type", "mdm")],
                status: 200)
        ] + pushTypeCases

    /// Apple's push types and the topic suffix each requires (Apple's "Sending notification requests to APNs"),
    /// written out here rather than taken from the client's vocabulary: each with and without its suffix.
    static let pushTypeCases: [Case] = [
        ("voip", ".voip"), ("complication", ".complication"), ("fileprovider", ".pushkit.fileprovider"),
        ("liveactivity", ".push-type.liveactivity"), ("location", ".location-query"), ("pushtotalk", ".voip-ptt"),
        ("widgets", ".push-type.widgets"), ("controls", ".push-type.controls")
    ].flatMap { pushType, suffix in
        [
            Case(
                name: "\(pushType) with \(suffix)",
                headers: [
                    ("apns-topic", "com.example.app" + suffix),
                    ("apns-push-type", pushType)
                ],
                body: pushType == "liveactivity" ? liveActivityBody : #"{"aps":{"alert":"hi"}}"#, status: 200),
            Case(
                name: "\(pushType) without its suffix",
                headers: [("apns-topic", "com.example.app"), ("apns-push-type", pushType)],
                status: 400, reason: "BadTopic")
        ]
    }

    static let liveActivityBody = #"{"aps":{"timestamp":1796184000,"event":"update","content-state":{"score":"1-0"}}}"#

    /// What ActivityKit needs of a Live Activity push: an event, a timestamp, content-state for a start or update.
    static let liveActivityCases: [Case] = [
        ("no event", #"{"aps":{"timestamp":1,"content-state":{}}}"#, 400),
        ("no timestamp", #"{"aps":{"event":"update","content-state":{}}}"#, 400),
        ("an update without content-state", #"{"aps":{"timestamp":1,"event":"update"}}"#, 400),
        ("an end without content-state", #"{"aps":{"timestamp":1,"event":"end"}}"#, 400),
        ("an end with its final content-state", #"{"aps":{"timestamp":1,"event":"end","content-state":{}}}"#, 200),
        ("an unknown event", #"{"aps":{"timestamp":1,"event":"pause","content-state":{}}}"#, 400)
    ].map { name, body, status in
        Case(
            name: "liveactivity: \(name)",
            headers: [
                ("apns-topic", "com.example.app.push-type.liveactivity"),
                ("apns-push-type", "liveactivity")
            ],
            body: body, status: status, reason: status == 400 ? "BadPayload" : nil)
    }

    @Test(arguments: cases + liveActivityCases)
    func judgesLikeAPNs(_ testCase: Case) throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let client = try HTTP2Client(
            configuration: .init(host: "127.0.0.1", port: simulator.port, tls: .init(caFile: caFile)),
            logger: logger)
        defer { client.shutdown() }
        var headers = HTTP2HeaderBlock.request(
            method: testCase.method, authority: client.authority, path: testCase.path)
        for (name, value) in testCase.headers { headers.add(name, value) }
        let answer = Locked<Result<HTTP2Response, HTTP2StreamError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        client.send(HTTP2Request(headers: headers, body: Array(testCase.body.utf8))) { result in
            answer.withLock { $0 = result }
            done.signal()
        }
        try #require(done.wait(timeout: .now() + 10) == .success, "answered within 10 s")
        let response = try #require(answer.withLock { $0 }).get()
        #expect(response.status == testCase.status)
        #expect(APNsResponse.parseBody(response.body).reason?.rawValue == testCase.reason)
        #expect(response.header("apns-id").map(APNsNotification.isCanonicalUUID) == true)
    }

    @Test func statsEndpointCounts() throws {
        let simulator = try APNsSimulator(configuration: .init(unregisteredTokens: [Self.token: 1]), logger: logger)
        defer { simulator.shutdown() }
        let caFile = try TestServices.temporaryFile("ca", contents: simulator.certificatePEM)
        let client = try HTTP2Client(
            configuration: .init(host: "127.0.0.1", port: simulator.port, tls: .init(caFile: caFile)),
            logger: logger)
        defer { client.shutdown() }
        func send(_ method: String, _ path: String, _ body: String) -> HTTP2Response? {
            var headers = HTTP2HeaderBlock.request(method: method, authority: client.authority, path: path)
            headers.add("apns-topic", "t")
            let answer = Locked<HTTP2Response?>(nil)
            let done = DispatchSemaphore(value: 0)
            client.send(HTTP2Request(headers: headers, body: Array(body.utf8))) { result in
                answer.withLock { $0 = try? result.get() }
                done.signal()
            }
            #expect(done.wait(timeout: .now() + 10) == .success, "answered within 10 s")
            return answer.withLock { $0 }
        }
        #expect(send("POST", "/3/device/\(Self.token)", "{}")?.status == 410)
        #expect(send("POST", "/3/device/00aa", "{}")?.status == 200)
        let stats = try #require(send("GET", "/sim/stats", ""))
        let object = try JSONSerialization.jsonObject(with: Data(stats.body)) as! [String: Any]
        #expect(object["received"] as? Int == 2)
        #expect((object["by_status"] as? [String: Int]) == ["200": 1, "410": 1])
    }

    @Test func aServerThatNeverAnswersTLSHitsTheConnectTimeout() throws {
        // A socket that listens but never accepts: TCP completes in the kernel's backlog, TLS never does.
        let (descriptor, port) = TestServices.listeningSocket()
        defer { close(descriptor) }
        let failed = DispatchSemaphore(value: 0)
        let reasons = Locked<[String]>([])
        var configuration = HTTP2Client.Configuration(host: "127.0.0.1", port: port, connectTimeout: 0.5)
        configuration.observer = { event in
            if case .connectFailed(let reason) = event {
                reasons.withLock { $0.append(reason) }
                failed.signal()
            }
        }
        let client = try HTTP2Client(configuration: configuration, logger: logger)
        defer { client.shutdown() }
        #expect(failed.wait(timeout: .now() + 10) == .success)
        #expect(reasons.withLock { $0.first?.contains("timed out") } == true, "\(reasons.withLock { $0 })")
    }
}
