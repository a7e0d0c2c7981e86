import AMQP
import APNsModel
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing
import WorkerPipeline

/// REDIS_URL with a password (percent-encoded, as in any URL) against a Redis that requires it, and AMQP_URL with a
/// vhost of its own and an encoded password: what deployments use, beyond the tests' open defaults.
@Suite struct CredentialsTests {
    @Test func aPasswordProtectedRedisIsUsedWithTheDecodedPassword() throws {
        let port = TestServices.freePort()
        let directory = NSTemporaryDirectory() + TestServices.unique("redis-auth")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let server = try TestServices.Daemon(
            "/usr/bin/redis-server",
            [
                "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", directory,
                "--requirepass", "pa:s/s@1"
            ])
        defer { server.stop() }
        let url = try RedisURL("redis://:pa%3As%2Fs%401@127.0.0.1:\(port)/3")
        // A freshly started redis-server takes a moment to listen: refusals until then are expected.
        var connection = try? RedisConnection(url: url)
        for _ in 0..<500 where connection == nil {
            usleep(10_000)
            connection = try? RedisConnection(url: url)
        }
        let cache = TokenCache(redis: try #require(connection), logger: Logger(label: "test"))
        let token = String(repeating: "c1", count: 32)
        try cache.register([
            TokenRegistration(user: "zed", token: token, scope: TokenScope(environment: .production), registeredAt: 5)
        ])
        #expect(try cache.entries(forUser: "zed").map(\.token) == [token])

        var wrong = url
        wrong.password = "nope"
        do {
            _ = try RedisConnection(url: wrong)
            Issue.record("a wrong password was accepted")
        } catch {
            #expect(
                error.description.contains("refused the password") && !error.description.contains("nope"), "\(error)")
        }
    }

    @Test func anAMQPVhostOfItsOwnWithAnEncodedPassword() throws {
        let rabbitmqctl = try TestServices.value("RABBITMQCTL")
        let vhost = TestServices.unique("tenant")
        let user = TestServices.unique("app")
        _ = try TestServices.run(rabbitmqctl, ["add_vhost", vhost])
        _ = try TestServices.run(rabbitmqctl, ["add_user", user, "s3cr3t/p@ss"])
        _ = try TestServices.run(rabbitmqctl, ["set_permissions", "-p", vhost, user, ".*", ".*", ".*"])
        defer { _ = try? TestServices.run(rabbitmqctl, ["delete_vhost", vhost]) }
        let base = try TestServices.amqpURL()
        let url = try AMQPURL("amqp://\(user):s3cr3t%2Fp%40ss@\(base.host):\(base.port)/\(vhost)")
        #expect(url.virtualHost == vhost && url.password == "s3cr3t/p@ss")
        let connection = try AMQPConnection(url: url)
        try connection.declareQueue("in-\(vhost)")
        try connection.enablePublisherConfirms()
        let sequence = try connection.publish(to: "in-\(vhost)", body: Array("x".utf8))
        #expect(try connection.waitForConfirms(through: sequence).isEmpty)
        let listing = try TestServices.run(rabbitmqctl, ["list_queues", "-p", vhost, "name", "messages", "--quiet"])
        #expect(listing.contains("in-\(vhost)\t1"), "the queue lives in the vhost: \(listing)")
        // A wrong password is refused by the broker (ACCESS_REFUSED, 403: permanent, so the worker stops trying)
        // and the error does not show it.
        let wrong = try AMQPURL("amqp://\(user):not-the-s3cr3t@\(base.host):\(base.port)/\(vhost)")
        do {
            _ = try AMQPConnection(url: wrong)
            Issue.record("a wrong password was accepted")
        } catch {
            #expect(error.code == 403 && error.isPermanent, "\(error.kind) \(error.code): \(error)")
            #expect(error.message.contains("ACCESS_REFUSED") && !error.message.contains("not-the-s3cr3t"), "\(error)")
        }
    }
}
