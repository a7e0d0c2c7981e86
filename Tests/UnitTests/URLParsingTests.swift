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

@Suite struct URLParsingTests {
    @Test func amqpURLs() throws {
        let url = try AMQPURL("amqp://user:p%40ss@broker.local:5673/%2f")
        #expect(url == AMQPURL(host: "broker.local", port: 5673, user: "user", password: "p@ss", virtualHost: "/"))
        #expect(url.description == "amqp://user:***@broker.local:5673/%2f", "no password in descriptions")
        #expect(try AMQPURL("amqps://h").port == 5671)
        #expect(try AMQPURL("amqps://h").usesTLS)
        #expect(try AMQPURL("amqp://h/prod").virtualHost == "prod")
        #expect(throws: AMQPError.self) { try AMQPURL("http://h") }
        #expect(throws: AMQPError.self) { try AMQPURL("amqp://h/") }
        #expect(throws: AMQPError.self) { try AMQPURL("amqp://h:0") }
    }

    /// A cluster's nodes in AMQP_URL: each URL its own, commas between them, no password in any text.
    @Test func amqpNodeLists() throws {
        let nodes = try AMQPNodes(
            "amqp://app:s3cret@rabbit-1:5672/prod, amqp://app:s3cret@rabbit-2:5672/prod,amqps://app:p%2Cw@rabbit-3/prod"
        )
        #expect(nodes.urls.map(\.host) == ["rabbit-1", "rabbit-2", "rabbit-3"])
        #expect(
            nodes.urls.allSatisfy { $0.virtualHost == "prod" }, "each URL keeps its own vhost; none swallows the next")
        #expect(nodes.urls[2].password == "p,w" && nodes.urls[2].port == 5671, "a comma in a password is %2C")
        #expect(
            !nodes.description.contains("s3cret") && !nodes.description.contains("p,w")
                && !nodes.description.contains("p%2Cw"))
        do {
            _ = try AMQPNodes("amqp://app:s3cret@rabbit-1/prod,amqp://app:s3cret@rabbit-2:99999/prod")
            Issue.record("a bad port was accepted")
        } catch {
            #expect(error.message.hasPrefix("URL 2 of 2: port 99999"), "\(error.message)")
            #expect(!error.message.contains("s3cret"))
        }
        #expect(throws: AMQPError.self) { try AMQPNodes("amqp://h,") }
    }

    /// A password with a raw comma splits one URL into two "nodes": the error says how to write the comma, and shows
    /// no part of the password (not even the half before the comma, which would otherwise be read as a port).
    @Test(arguments: ["amqp://app:se,cret@rabbit-1:5672/prod", "amqp://app:12,34@rabbit-1:5672/prod"])
    func aRawCommaInAPasswordIsExplained(url: String) {
        do {
            _ = try AMQPNodes(url)
            Issue.record("a password with a raw comma was accepted")
        } catch {
            #expect(
                error.message.contains("a comma separates nodes") && error.message.contains("%2C"), "\(error.message)")
            #expect(
                !error.message.contains("port ") && !error.message.contains("cret") && !error.message.contains("34"),
                "\(error.message)")
        }
    }

    /// The parser both URLs share: the parts split, credentials percent-decoded, an IPv6 literal's brackets dropped,
    /// errors by part.
    @Test func serviceURLParts() throws {
        let url = try ServiceURL("redis://ops%40team:pa%3As@[::1]:6380/2")
        #expect(url.scheme == "redis" && url.user == "ops@team" && url.password == "pa:s")
        #expect(url.host == "::1" && url.port == 6380 && url.path == "2")
        #expect(try ServiceURL("amqp://bob@h").user == "bob" && ServiceURL("amqp://bob@h").password == nil)
        #expect(try ServiceURL("redis://secret@h", loneCredential: .password).password == "secret")
        #expect(try ServiceURL("amqp://h").path == nil && ServiceURL("amqp://h/").path == "")
        #expect(throws: ServiceURLError.badPort("x")) { try ServiceURL("amqp://h:x") }
        #expect(ServiceURLError.badPort("70000").description == "port 70000 is not a number from 1 to 65535")
        do {
            _ = try ServiceURL("amqp://guest:s3cret-pass")
            Issue.record("a URL whose password stands where the port goes is refused")
        } catch {
            #expect(!error.description.contains("s3cret"), "the password is never echoed: \(error)")
        }
        #expect(throws: ServiceURLError.noHost) { try ServiceURL("amqp://u:p@:5672") }
        #expect(throws: ServiceURLError.badPercentEncoding("password")) { try ServiceURL("amqp://u:%zz@h") }
        #expect(throws: ServiceURLError.noScheme) { try ServiceURL("h:5672") }
        #expect(try RedisURL("redis://[::1]:6380/0").host == "::1", "Redis takes an IPv6 literal as AMQP does")
        #expect(try AMQPURL("amqp://[::1]:5673").host == "::1")
    }

    @Test func redisURLs() throws {
        #expect(try RedisURL("redis://127.0.0.1:6380/2") == RedisURL(host: "127.0.0.1", port: 6380, database: 2))
        let secret = try RedisURL("redis://:s3cret@cache:6379/0")
        #expect(secret.password == "s3cret")
        #expect(!secret.description.contains("s3cret"))
        let encoded = try RedisURL("redis://ops%40team:pa%3As%2Fs%25@cache:6379/1")
        #expect(encoded.user == "ops@team" && encoded.password == "pa:s/s%", "credentials are percent-decoded")
        #expect(
            try RedisURL("redis://:pa:ss@cache").password == "pa:ss", "a colon after the first belongs to the password")
        #expect(throws: RedisError.self) { try RedisURL("redis://:bad%zz@cache") }
        let secure = try RedisURL("rediss://:s3cret@cache:6380/2")
        #expect(
            secure.tls == RedisTLS() && secure.port == 6380 && secure.description == "rediss://:***@cache:6380/2",
            "rediss:// is TLS")
        #expect(try RedisURL("redis://cache").tls == nil)
        #expect(throws: RedisError.self) { try RedisURL("http://cache") }
        #expect(throws: RedisError.self) { try RedisURL("redis://cache/x") }
    }
}
