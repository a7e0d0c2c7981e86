import AMQP
import AMQPBroker
import APNsModel
import Telemetry
import Testing
import WorkerPipeline

/// Queues declared in bursts (`AMQPConnection.declareQueues`), with the meaning of declaring each in turn, as a
/// worker's first session declares its queues.
@Suite struct QueueDeclarationTests {
    @Test func aBurstDeclaresEveryQueueWithItsArguments() throws {
        let connection = try AMQPConnection(url: TestServices.amqpURL())
        let names = (0..<25).map { TestServices.unique("burst-\($0)") }
        try connection.declareQueues(names.map { (name: $0, arguments: ["x-message-ttl": .integer(60_000)]) })
        let listing = try TestServices.run(
            TestServices.value("RABBITMQCTL"), ["list_queues", "name", "arguments", "--quiet"])
        for name in names {
            let line = listing.split(separator: "\n").first { $0.hasPrefix(name + "\t") }
            #expect(line?.contains("60000") == true, "\(name) with its TTL: \(line ?? "not listed")")
        }
    }

    /// Someone declared one of the queues before with other arguments (another TTL): the broker refuses that
    /// declaration and closes the channel, which drops the declarations after it; they are made all the same, and
    /// that queue is used as it is.
    @Test func aQueueDeclaredBeforeWithOtherArgumentsDoesNotStopTheOthers() throws {
        let connection = try AMQPConnection(url: TestServices.amqpURL())
        let names = (0..<25).map { TestServices.unique("burst-\($0)") }
        try connection.declareQueue(names[14], arguments: ["x-message-ttl": .integer(600_000)])
        try connection.declareQueues(names.map { (name: $0, arguments: ["x-message-ttl": .integer(300_000)]) })
        for name in names { #expect(try connection.queueStatus(name) != nil, "\(name) declared") }
        let listing = try TestServices.run(
            TestServices.value("RABBITMQCTL"), ["list_queues", "name", "arguments", "--quiet"])
        let refused = listing.split(separator: "\n").first { $0.hasPrefix(names[14] + "\t") }
        #expect(refused?.contains("600000") == true, "used as it was declared: \(refused ?? "not listed")")
        // And the channel works on: a publish to the last of them lands there.
        try connection.publish(to: names[24], body: Array("after the refusal".utf8))
        #expect(
            try TestServices.waitUntil(timeout: 10) { try connection.queueStatus(names[24])?.messages == 1 },
            "the publish after the refusal reached \(names[24])")
    }

    /// A worker's first session declares its queues in bursts before it consumes: every delay queue of both lanes
    /// is there (the last ones in the last burst), and its first publications (a dead-token event through the
    /// exchange, a parked job, a retry) reach their queues.
    @Test func aNewWorkersQueuesAreAllThereBeforeItsFirstPublications() throws {
        let prefix = TestServices.unique("first-publish")
        let queues = QueueNames(
            jobs: prefix + ".jobs", bulk: prefix + ".bulk", failed: prefix + ".failed", deadTokens: prefix + ".dead",
            registrations: prefix + ".registrations")
        let settings = AMQPJobBroker.Settings(
            nodes: try AMQPNodes(TestServices.amqpURL()), queues: queues, retryDelays: [1])
        let broker = try AMQPJobBroker(settings: settings, logger: Logger(label: "first-publish", level: .critical))
        defer { broker.close() }
        let checker = try AMQPConnection(url: TestServices.amqpURL())
        try #require(settings.delayQueues.count * 2 > 2 * AMQPConnection.declarationsPerRoundTrip, "several bursts")
        for lane in JobLane.allCases {
            for delay in settings.delayQueues {
                let name = queues.retry(delay: delay, lane: lane)
                #expect(try checker.queueStatus(name) != nil, "\(name) declared")
            }
        }
        let outcomes = try broker.publish(
            [Publication.Destination.deadTokens, .failed, .retry(delay: 1, lane: .urgent)].map {
                Publication(destination: $0, body: Array("first".utf8), properties: MessageProperties())
            })
        #expect(outcomes == [.taken, .taken, .taken])
        for queue in [queues.deadTokens, queues.failed] {
            #expect(
                try TestServices.waitUntil(timeout: 10) { try checker.queueStatus(queue)?.messages == 1 },
                "\(queue) holds its publication")
        }
    }
}
