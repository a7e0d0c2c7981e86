import AMQP
import Testing

/// Queues declared in one burst (`AMQPConnection.declareQueues`): one round trip for them all, with the meaning of
/// declaring each in turn.
@Suite struct QueueDeclarationTests {
    @Test func aBurstDeclaresEveryQueueWithItsArguments() throws {
        let connection = try AMQPConnection(url: TestServices.amqpURL())
        let names = (0..<5).map { TestServices.unique("burst-\($0)") }
        try connection.declareQueues(names.map { (name: $0, arguments: ["x-message-ttl": .integer(60_000)]) })
        for name in names { #expect(try connection.queueStatus(name) != nil, "\(name) declared") }
        let listing = try TestServices.run(
            TestServices.value("RABBITMQCTL"), ["list_queues", "name", "arguments", "--quiet"])
        for name in names {
            let line = listing.split(separator: "\n").first { $0.hasPrefix(name + "\t") }
            #expect(line?.contains("60000") == true, "\(name) with its TTL: \(line ?? "not listed")")
        }
    }

    /// Someone declared one of the queues before with other arguments (here a quorum queue): the broker refuses that
    /// declaration and closes the channel, which drops those after it; they are declared all the same, and the
    /// queue is used as it is.
    @Test func aQueueDeclaredBeforeWithOtherArgumentsDoesNotStopTheOthers() throws {
        let connection = try AMQPConnection(url: TestServices.amqpURL())
        let existing = TestServices.unique("declared-quorum")
        try connection.declareQueue(existing, arguments: ["x-queue-type": .string("quorum")])
        let before = TestServices.unique("burst-before")
        let after = TestServices.unique("burst-after")
        try connection.declareQueues([
            (name: before, arguments: [:]), (name: existing, arguments: [:]), (name: after, arguments: [:])
        ])
        #expect(try connection.queueStatus(before) != nil)
        #expect(try connection.queueStatus(existing) != nil)
        #expect(try connection.queueStatus(after) != nil, "declared although one before it was refused")
    }
}
