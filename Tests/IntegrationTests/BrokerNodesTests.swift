import AMQP
import Foundation
import Testing

/// AMQP_URL as a list of nodes: programs start on a node that answers and pass over those that do not.
@Suite struct BrokerNodesTests {
    /// A node nobody listens on, with a password that must never show.
    static func deadNode() -> AMQPURL {
        AMQPURL(host: "127.0.0.1", port: TestServices.freePort(), user: "guest", password: "dead-node-secret")
    }

    @Test func aNodeThatDoesNotAnswerIsPassedOver() throws {
        let live = try TestServices.amqpURL()
        let nodes = AMQPNodes([Self.deadNode(), live, Self.deadNode()])
        for start in 0..<3 {
            let connection = try nodes.connect(connectTimeout: 2, startingAt: start)
            #expect(connection.url == live, "from node \(start + 1) on, the live node is found")
            #expect(try connection.queueStatus(TestServices.unique("absent")) == nil, "and it works")
            connection.close()
        }
    }

    @Test func whenNoNodeAnswersTheErrorSaysWhatEachDidAndShowsNoPassword() throws {
        let nodes = AMQPNodes([Self.deadNode(), Self.deadNode()])
        do {
            _ = try nodes.connect(connectTimeout: 2)
            Issue.record("connected to nothing")
        } catch {
            #expect(error.isConnectionLost, "a cluster that is down is waited for, not a configuration error")
            #expect(error.message.hasPrefix("no broker node answered: cannot connect to amqp://guest:***@127.0.0.1:"),
                    "\(error.message)")
            #expect(error.message.components(separatedBy: "cannot connect").count == 3, "both nodes named")
            #expect(!error.message.contains("dead-node-secret"))
        }
    }

    @Test func wrongCredentialsOnEveryNodeArePermanent() throws {
        var wrong = try TestServices.amqpURL()
        wrong.password = "not-the-password"
        do {
            _ = try AMQPNodes([wrong, wrong]).connect(connectTimeout: 2)
            Issue.record("logged in with a wrong password")
        } catch {
            #expect(error.isPermanent, "\(error.message)")
            #expect(!error.message.contains("not-the-password"))
        }
    }
}
