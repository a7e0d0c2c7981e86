import AMQP
import AMQPBroker
import Foundation
import Telemetry
import Testing
import WorkerPipeline

/// The bulk lane's prefetch by bytes (WORKER_BULK_PREFETCH_BYTES), as the broker itself reports it: a worker on a
/// backlog of campaigns holds a few of them, not WORKER_BULK_PREFETCH; on small jobs it takes the whole prefetch.
@Suite struct BulkLaneBytesTests {
    let logger = Logger(label: "bulk-bytes", level: .critical)

    /// A broker session on queues of the test's own, the bulk lane's prefetch and bytes as given.
    func broker(bulk: String, bulkPrefetch: Int, bytes: Int) throws -> AMQPJobBroker {
        let prefix = TestServices.unique("lane")
        let queues = QueueNames(
            jobs: prefix + ".jobs", bulk: bulk, failed: prefix + ".failed", deadTokens: prefix + ".dead",
            registrations: prefix + ".registrations")
        return try AMQPJobBroker(
            settings: .init(
                nodes: AMQPNodes(TestServices.amqpURL()), queues: queues, retryDelays: [1], bulkPrefetch: bulkPrefetch,
                bulkPrefetchBytes: bytes),
            logger: logger)
    }

    /// The broker's own figures for `queue`: its consumers' prefetch, messages ready and delivered unacknowledged.
    static func brokerView(_ queue: String) throws -> (prefetches: [Int], ready: Int, unacknowledged: Int) {
        let rabbitmqctl = try TestServices.value("RABBITMQCTL")
        let consumers = try TestServices.run(
            rabbitmqctl, ["-q", "list_consumers", "--no-table-headers", "queue_name", "prefetch_count"])
        let prefetches = consumers.split(separator: "\n").compactMap { line -> Int? in
            let fields = line.split(separator: "\t")
            return fields.count == 2 && fields[0] == queue ? Int(fields[1]) : nil
        }
        let queues = try TestServices.run(
            rabbitmqctl,
            ["-q", "list_queues", "--no-table-headers", "name", "messages_ready", "messages_unacknowledged"])
        let row = queues.split(separator: "\n").map { $0.split(separator: "\t") }
            .first { $0.first.map(String.init) == queue }
        let figures = try #require(row.flatMap { $0.count == 3 ? (Int($0[1]), Int($0[2])) : nil })
        return (prefetches, try #require(figures.0), try #require(figures.1))
    }

    /// Reads what the broker hands over until `enough` deliveries were read (or 20 s pass).
    static func read(_ broker: AMQPJobBroker, into deliveries: inout [JobDelivery], until enough: Int) throws {
        var read: [JobDelivery] = []
        let arrived = try TestServices.waitUntil {
            for case .delivery(let delivery) in try broker.receive(limit: 100) { read.append(delivery) }
            return deliveries.count + read.count >= enough
        }
        deliveries += read
        try #require(arrived, "\(deliveries.count) deliveries read of \(enough)")
    }

    @Test func campaignsAreHandedOverAFewAtATime() throws {
        let bulk = TestServices.unique("campaigns")
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        defer { publisher.close() }
        try publisher.declareQueue(bulk)
        let body = [UInt8](repeating: UInt8(ascii: "x"), count: 300_000)
        for _ in 0..<12 { try publisher.publish(to: bulk, body: body) }
        let broker = try broker(bulk: bulk, bulkPrefetch: 100, bytes: 1_000_000)
        defer { broker.close() }

        var deliveries: [JobDelivery] = []
        try Self.read(broker, into: &deliveries, until: 3)
        let view = try Self.brokerView(bulk)
        // Three bodies of 300 KB fit in 1 MB; the first consumer (before any body was seen) takes four.
        #expect(view.prefetches.count == 1 && view.prefetches.allSatisfy { $0 <= 4 }, "prefetch \(view.prefetches)")
        #expect(view.unacknowledged <= 4 && view.ready >= 8, "\(view.unacknowledged) held, \(view.ready) waiting")
        #expect(deliveries.allSatisfy { $0.lane == .bulk })

        // Settled, they make room for the next: the whole backlog goes through.
        var settled = 0
        while settled < 12 {
            let batch = deliveries[settled...].map(\.tag)
            try broker.acknowledge(batch)
            settled += batch.count
            if settled < 12 { try Self.read(broker, into: &deliveries, until: settled + 1) }
            #expect(deliveries.count - settled <= 4, "\(deliveries.count - settled) held at once")
        }
        #expect(deliveries.count == 12)
        #expect(try Self.brokerView(bulk).ready == 0)
    }

    @Test func smallJobsTakeTheWholePrefetch() throws {
        let bulk = TestServices.unique("small")
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        defer { publisher.close() }
        try publisher.declareQueue(bulk)
        for job in 0..<150 { try publisher.publish(to: bulk, body: Array(#"{"id": "\#(job)"}"#.utf8)) }
        let broker = try broker(bulk: bulk, bulkPrefetch: 100, bytes: 1_000_000)
        defer { broker.close() }

        var deliveries: [JobDelivery] = []
        try Self.read(broker, into: &deliveries, until: 100)
        #expect(deliveries.count >= 100, "read \(deliveries.count) of the 100 the prefetch allows")
        #expect(try Self.brokerView(bulk).prefetches == [100])
    }
}
