import AMQP
import APNs
import Configuration
import Foundation
import HTTP2
import JSON
import Redis
import ServiceURLs
import Telemetry
import Testing
import WorkerPipeline

/// APNS_CREDENTIALS_FILE: its shape, what each entry serves, and the errors that name the entry.
@Suite struct CredentialsFileTests {
    let keyFile: String
    let directory: String

    init() throws {
        directory = NSTemporaryDirectory() + "credentials-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        keyFile = directory + "/AuthKey.p8"
        try ES256Key.generatePrivateKeyPEM().write(toFile: keyFile, atomically: true, encoding: .utf8)
    }

    func load(_ json: String, single: Bool = false) throws(ConfigurationError) -> APNsCredentials {
        let path = directory + "/credentials-\(UUID().uuidString).json"
        try? json.write(toFile: path, atomically: true, encoding: .utf8)
        var environment = ["APNS_CREDENTIALS_FILE": path, "APNS_TOPIC": "com.default.app"]
        if single {
            environment.merge(["APNS_KEY_FILE": keyFile, "APNS_KEY_ID": "DEFAULT001", "APNS_TEAM_ID": "TEAMDEFAUL"]) {
                $1
            }
        }
        return try WorkerConfiguration.load(from: environment).credential.makeCredentials()
    }

    func entry(team: String, key: String, topics: String, extra: String = "") -> String {
        #"{"team_id": "\#(team)", "key_id": "\#(key)", "key_file": "AuthKey.p8", "topics": \#(topics)\#(extra)}"#
    }

    /// A topic picks the entry listing its bundle ID, with or without a push type's suffix; every other topic goes
    /// to the single-key default, or to none without one. A relative key path is read beside the file.
    @Test func aTopicPicksTheEntryOfItsBundle() throws {
        let json =
            #"{"credentials": [\#(entry(team: "TEAM00000A", key: "KEY000000A", topics: #"["com.a.app", "com.a.driver"]"#, extra: #", "rate_limit": 50"#)), \#(entry(team: "TEAM00000B", key: "KEY000000B", topics: #"["com.b.app"]"#))]}"#
        let credentials = try load(json, single: true)
        #expect(credentials.credential(forTopic: "com.a.app")?.name == "TEAM00000A/KEY000000A")
        #expect(credentials.credential(forTopic: "com.a.driver.voip")?.name == "TEAM00000A/KEY000000A")
        #expect(credentials.credential(forTopic: "com.b.app.push-type.liveactivity")?.name == "TEAM00000B/KEY000000B")
        #expect(credentials.credential(forTopic: "com.a.application")?.name == "TEAMDEFAUL/DEFAULT001")
        #expect(credentials.credential(forTopic: "com.a.app")?.rateLimit == 50)
        #expect(credentials.credential(forTopic: "com.b.app")?.rateLimit == 0)
        let withoutDefault = try load(json)
        #expect(withoutDefault.credential(forTopic: "com.other.app") == nil)
        #expect(withoutDefault.credential(forTopic: "com.b.app") != nil)
    }

    @Test(arguments: [
        (#"{"credentials": [ "#, "not JSON"),
        (#"{"keys": []}"#, #"wants {"credentials": [ ... ]}"#),
        (
            #"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": []}]}"#,
            "entry 1 (team TEAM00000A, key KEY000000A): \"topics\" wants a non-empty list"
        ),
        (
            #"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topic": ["com.a"]}]}"#,
            "entry 1 (team TEAM00000A, key KEY000000A): unknown field \"topic\""
        ),
        (
            #"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": ["com.a"], "rate_limit": -1}]}"#,
            "\"rate_limit\" wants a whole number"
        ),
        (
            #"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": ["com.a"], "rate_limit": true}]}"#,
            "\"rate_limit\" wants a whole number"
        ),
        (
            #"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": ["com.a"], "rate_limit": 1e18}]}"#,
            "\"rate_limit\" wants a whole number of notifications per second from 0 to 10000000"
        ),
        (#"{"credentials": [{"topics": ["com.a"]}]}"#, "entry 1: names no credential"),
        (
            #"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "missing.p8", "topics": ["com.a"]}]}"#,
            "entry 1 (team TEAM00000A, key KEY000000A)"
        ),
        (
            #"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY0A", "key_file": "AuthKey.p8", "topics": ["com.a"]}]}"#,
            "entry 1 (team TEAM00000A, key KEY0A)"
        ),
        (
            #"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": ["com.a"]}, {"cert_file": "missing.pem", "topics": ["com.a"]}]}"#,
            "entry 2 (certificate "
        ),
        (
            #"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": ["com.a", "com.b"]}, {"team_id": "TEAM00000B", "key_id": "KEY000000B", "key_file": "AuthKey.p8", "topics": ["com.b"]}]}"#,
            "entry 2 (TEAM00000B/KEY000000B) lists com.b, which TEAM00000A/KEY000000A serves already"
        ),
        (#"{"credentials": []}"#, "lists no credential")
    ])
    func aBadFileIsRefusedNamingTheEntry(json: String, expected: String) {
        do {
            _ = try load(json)
            Issue.record("accepted: \(json)")
        } catch {
            #expect(error.key == "APNS_CREDENTIALS_FILE" && error.problem.contains(expected), "\(error)")
        }
    }

    /// A problem quotes what the file holds briefly: a topics list holding a large object does not fill the log.
    @Test func aProblemQuotesWhatTheFileHoldsBriefly() {
        let large = "{" + (0..<2_000).map { "\"field\($0)\": \($0)" }.joined(separator: ", ") + "}"
        do {
            _ = try load(
                #"{"credentials": [{"team_id": "TEAM00000A", "key_id": "KEY000000A", "key_file": "AuthKey.p8", "topics": [\#(large)]}]}"#
            )
            Issue.record("a topic that is an object was accepted")
        } catch {
            #expect(
                error.problem.contains("not a bundle ID") && error.problem.count < 400,
                "\(error.problem.count) characters")
        }
    }

    /// A certificate entry is loaded as a connection would load it: an expired one, or a key that is not the
    /// certificate's, is refused naming the entry; a good one is named by its common name.
    @Test func aCertificateEntryIsCheckedAtLoad() throws {
        func pair(_ name: String, days: Int) throws -> (certificate: String, key: String) {
            let generated = try SelfSignedCertificate.generate(commonName: name, days: days)
            let certificate = directory + "/\(UUID().uuidString).pem"
            let key = directory + "/\(UUID().uuidString).key"
            try generated.certificatePEM.write(toFile: certificate, atomically: true, encoding: .utf8)
            try generated.privateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
            return (certificate, key)
        }
        let good = try pair("Apple Push Services: com.c.app", days: 100)
        let other = try pair("com.d.app", days: 100)
        let expired = try pair("com.e.app", days: -1)
        func entry(_ certificate: String, _ key: String) -> String {
            #"{"credentials": [{"cert_file": "\#(certificate)", "cert_key_file": "\#(key)", "topics": ["com.c.app"]}]}"#
        }
        #expect(
            try load(entry(good.certificate, good.key)).credential(forTopic: "com.c.app")?.name
                == "certificate:Apple Push Services: com.c.app")
        for (json, expected) in [
            (entry(good.certificate, other.key), "entry 1 (certificate \(good.certificate))"),
            (entry(expired.certificate, expired.key), "the certificate expired on")
        ] {
            do {
                _ = try load(json)
                Issue.record("accepted: \(json)")
            } catch {
                #expect(error.key == "APNS_CREDENTIALS_FILE" && error.problem.contains(expected), "\(error)")
            }
        }
    }

    /// A reload that reads the same credential again keeps it (its connections and provider token carry on); a
    /// changed key file is a new credential and the old one is retired.
    @Test func aReloadKeepsWhatDidNotChange() throws {
        let json =
            #"{"credentials": [\#(entry(team: "TEAM00000A", key: "KEY000000A", topics: #"["com.a.app"]"#)), {"team_id": "TEAM00000B", "key_id": "KEY000000B", "key_file": "B.p8", "topics": ["com.b.app"]}]}"#
        try ES256Key.generatePrivateKeyPEM().write(toFile: directory + "/B.p8", atomically: true, encoding: .utf8)
        let client = APNsClient(
            configuration: APNsClientConfiguration(), credentials: try load(json),
            logger: Logger(label: "test", level: .critical))
        defer { client.shutdown() }
        let before = client.credential(forTopic: "com.a.app")
        let same = client.replaceCredentials(try load(json))
        #expect(same.added.isEmpty && same.retired.isEmpty)
        #expect(client.credential(forTopic: "com.a.app") === before)
        try ES256Key.generatePrivateKeyPEM().write(toFile: directory + "/B.p8", atomically: true, encoding: .utf8)
        let changed = client.replaceCredentials(try load(json))
        #expect(changed.added == ["TEAM00000B/KEY000000B"] && changed.retired == ["TEAM00000B/KEY000000B"])
        #expect(client.credential(forTopic: "com.a.app") === before)
    }
}
