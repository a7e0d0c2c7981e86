import AMQP
import APNs
import APNsSimulator
import Foundation
import HTTP2
import Telemetry
import Testing
import WorkerPipeline

/// amqps:// against the broker's TLS listener (scripts/test gives it a private CA).
@Suite struct AMQPTLSTests {
    @Test func messagesRoundTripOverTLS() throws {
        let url = try AMQPURL(TestServices.value("AMQPS_URL"))
        #expect(url.usesTLS)
        let connection = try AMQPConnection(url: url, caFile: try TestServices.value("AMQPS_CA_FILE"))
        let queue = TestServices.unique("tls")
        try connection.declareQueue(queue)
        try connection.enablePublisherConfirms()
        let sequence = try connection.publish(to: queue, body: Array("over TLS".utf8))
        #expect(try connection.waitForConfirms(through: sequence).isEmpty)
        try connection.consume(queue)
        guard case .delivery(let delivery)? = try connection.nextEvent(timeout: 10) else {
            Issue.record("no delivery over TLS")
            return
        }
        #expect(delivery.body == Array("over TLS".utf8))
        try connection.ack(delivery.deliveryTag)
    }

    @Test func aBrokerCertificateFromAnUnknownCAIsRefused() throws {
        let url = try AMQPURL(TestServices.value("AMQPS_URL"))
        let otherCA = try TestServices.temporaryFile(
            "other-ca.pem", contents: try SelfSignedCertificate.generate(commonName: "unrelated CA").certificatePEM)
        do {
            _ = try AMQPConnection(url: url, caFile: otherCA)
            Issue.record("connected to a broker whose certificate no trusted CA signed")
        } catch {
            // Refused for the certificate, not for anything else (a wrong port, a broker that is down): a setting to
            // fix, which the worker does not wait out.
            #expect(error.message.contains("SSL") && error.isCertificateRefused && error.isPermanent, "\(error)")
        }
        _ = try AMQPConnection(url: url, caFile: try TestServices.value("AMQPS_CA_FILE")).close()  // the right CA works
    }

    @Test func theWorkerConsumesOverTLS() throws {
        let logger = Logger(label: "amqps", level: .critical)
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        try publisher.publish(
            to: jobs,
            body: Array(
                #"{"id": "tls-1", "tokens": ["\#(String(repeating: "2c", count: 32))"], "payload": {"aps": {}}}"#.utf8),
            properties: AMQPProperties(replyTo: replies))
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(
                simulator: simulator, jobs: jobs,
                [
                    "AMQP_URL": try TestServices.value("AMQPS_URL"),
                    "AMQP_CA_FILE": try TestServices.value("AMQPS_CA_FILE")
                ]), logger: logger)
        defer { workerThread.stop() }
        let summary =
            try JSONSerialization.jsonObject(with: Data(try #require(try replyReader.read(1).first).body))
            as! [String: Any]
        #expect(summary["job_id"] as? String == "tls-1")
        #expect(summary["delivered"] as? Int == 1)
    }
}
