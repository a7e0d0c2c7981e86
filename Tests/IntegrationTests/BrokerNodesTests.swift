import AMQP
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

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

    /// A node that accepts connections and answers nothing (frozen, cut off) is given up after the connect timeout,
    /// login included, and from then on tried after the nodes that answer.
    @Test func aNodeThatAcceptsAndAnswersNothingIsGivenUpAndTriedLast() throws {
        let (listener, port) = TestServices.listeningSocket()
        defer { close(listener) }
        let silent = AMQPURL(host: "127.0.0.1", port: port, user: "guest", password: "guest")
        let live = try TestServices.amqpURL()
        let nodes = AMQPNodes([silent, live])
        let connection = try nodes.connect(connectTimeout: 1, startingAt: 0)
        #expect(connection.url == live)
        connection.close()
        #expect(AMQPNodeHealth.shared.isSilent(silent), "noted as silent")
        #expect(!AMQPNodeHealth.shared.isSilent(live))
        #expect(nodes.attemptOrder(startingAt: 0, isSilent: AMQPNodeHealth.shared.isSilent) == [live, silent])
    }

    @Test func nodesFoundSilentComeLastInARound() {
        let nodes = AMQPNodes((1...4).map { AMQPURL(host: "10.0.0.\($0)", port: 5672, user: "u", password: "p") })
        let order = nodes.attemptOrder(startingAt: 1) { $0.host == "10.0.0.2" || $0.host == "10.0.0.4" }
        #expect(order.map(\.host) == ["10.0.0.3", "10.0.0.1", "10.0.0.2", "10.0.0.4"])
        #expect(
            nodes.attemptOrder(startingAt: 6) { _ in false }.map(\.host) == [
                "10.0.0.3", "10.0.0.4", "10.0.0.1", "10.0.0.2"
            ])
    }

    @Test func whenNoNodeAnswersTheErrorSaysWhatEachDidAndShowsNoPassword() throws {
        let nodes = AMQPNodes([Self.deadNode(), Self.deadNode()])
        do {
            _ = try nodes.connect(connectTimeout: 2)
            Issue.record("connected to nothing")
        } catch {
            #expect(error.isConnectionLost, "a cluster that is down is waited for, not a configuration error")
            #expect(
                error.message.hasPrefix("no broker node answered: cannot connect to amqp://guest:***@127.0.0.1:"),
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
