import AMQP
import APNsSimulator
import Foundation
import Telemetry
import Testing

/// Headers of every type a publisher sets, and its other properties, survive what the worker publishes again from a
/// job, checked with an independent client (pika, the Python AMQP 0-9-1 client: installed by scripts/test) on both
/// ends.
@Suite struct HeaderFidelityTests {
    let logger = Logger(label: "headers", level: .critical)

    /// pika publishes a job with `SPECIMEN`'s headers (a number of each width, a flag, a decimal, a time,
    /// bytes, a table, an array, a void, text) and `PROPERTIES` (with an expiration), or reads one message and says
    /// how its headers and properties differ from them (a copy carries no expiration: it must not expire on its way).
    static let client = #"""
        import datetime, decimal, sys, pika
        SPECIMEN = {
            "x-int": 42, "x-long": pika.compat.long(2 ** 40), "x-negative": -7, "x-flag": True,
            "x-decimal": decimal.Decimal("3.14"), "x-time": datetime.datetime(2026, 12, 7, 6, 30),
            "x-bytes": b"\x00\xffraw", "x-table": {"a": 1, "b": "two", "c": [1, "x"]},
            "x-array": [1, "two", False, None], "x-void": None, "x-text": "plain",
        }
        PROPERTIES = {
            "content_type": "text/plain; charset=utf-8", "content_encoding": "identity", "type": "push",
            "app_id": "billing", "priority": 5,
        }
        url, mode, queue = sys.argv[1:4]
        channel = pika.BlockingConnection(pika.URLParameters(url)).channel()
        if mode == "publish":
            headers = dict(SPECIMEN, **{"x-apns-worker-republished": 1} if len(sys.argv) > 5 else {})
            channel.basic_publish("", queue, sys.argv[4].encode(),
                                  pika.BasicProperties(headers=headers, delivery_mode=2, expiration="600000",
                                                       **PROPERTIES))
            print("published")
        elif mode == "publish-big":
            channel.basic_publish("", queue, sys.argv[4].encode(),
                                  pika.BasicProperties(headers={"x-big": "a" * int(sys.argv[5])}, delivery_mode=2))
            print("published")
        else:
            for method, properties, body in channel.consume(queue, inactivity_timeout=30):
                if method is None:
                    sys.exit("nothing on " + queue)
                got = properties.headers or {}
                if mode == "names":
                    print(" ".join(sorted(got)))
                    print(got.get("x-apns-worker-headers-left-out", ""))
                    break
                wrong = [f"{k}={got.get(k)!r}" for k, v in SPECIMEN.items()
                         if k not in got or got[k] != v or type(got[k]) != type(v)]
                wrong += [f"{k}={getattr(properties, k)!r}" for k, v in PROPERTIES.items()
                          if getattr(properties, k) != v]
                wrong += [f"expiration={properties.expiration!r}"] if properties.expiration is not None else []
                print("ok" if not wrong else "differ: " + ", ".join(wrong))
                print(got.get("x-apns-worker-reason", ""))
                break
        """#

    static func pika(_ arguments: [String]) throws -> [String] {
        try TestServices.python(client, [try TestServices.value("AMQP_URL")] + arguments)
            .split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    }

    /// Retried twice through the delay queue (APNs throttles its token), then parked: the parked copy, published
    /// from the second retry, which was published from the first, carries every header as pika wrote it.
    @Test func headersOfEveryTypeAndPropertiesSurviveRetriesAndParking() throws {
        let throttled = String(repeating: "a7", count: 32)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.throttledTokens = [throttled]
        let simulator = try APNsSimulator(configuration: .init(behaviour: behaviour), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, _, _, publisher) = try TestServices.jobQueues()
        // Declared before pika reads it, as the worker declares it.
        let failed = TestServices.unique("failed")
        try publisher.declareQueue(failed)
        let workerThread = try WorkerThread.retrying(simulator: simulator, jobs: jobs, failed: failed, logger: logger)
        defer { workerThread.stop() }
        let job = #"{"id": "typed", "tokens": ["\#(throttled)"], "payload": {"aps": {"alert": "hi"}}}"#
        #expect(try Self.pika(["publish", jobs, job]).first == "published")
        let parked = try Self.pika(["read", failed])
        #expect(parked.first == "ok", "\(parked)")
        #expect(parked.dropFirst().first?.contains("TooManyRequests") == true, "parked after its attempts: \(parked)")
        #expect(simulator.received().filter { $0.deviceToken == throttled }.count == 3)
    }

    /// apns-sim, a jobs queue with its publisher and reply reader, and a worker that parks on a failed queue of its
    /// own, declared before pika reads it (as the worker declares it).
    struct Parking {
        let simulator: APNsSimulator
        let jobs, replies, failed: String
        let replyReader: QueueReader
        let publisher: AMQPConnection
        let worker: WorkerThread

        func stop() {
            worker.stop()
            simulator.shutdown()
        }
    }

    func parking() throws -> Parking {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let failed = TestServices.unique("failed")
        try publisher.declareQueue(failed)
        let worker = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs, ["PUSH_FAILED_QUEUE": failed]),
            logger: logger)
        return Parking(
            simulator: simulator, jobs: jobs, replies: replies, failed: failed, replyReader: replyReader,
            publisher: publisher, worker: worker)
    }

    /// A job the worker refuses is parked at once, with the headers and properties it came with.
    @Test func aRefusedJobIsParkedWithItsHeadersAndProperties() throws {
        let h = try parking()
        defer { h.stop() }
        let refused = #"{"id": "no-targets", "payload": {"aps": {}}}"#
        #expect(try Self.pika(["publish", h.jobs, refused]).first == "published")
        let parked = try Self.pika(["read", h.failed])
        #expect(parked.first == "ok", "\(parked)")
        #expect(parked.dropFirst().first?.isEmpty == false, "with its reason: \(parked)")
    }

    /// A job whose headers fill its frame, refused: its parked copy cannot carry them and the worker's reason too. It
    /// is parked with the worker's headers and a count of those left out, and the worker goes on (the publish ended
    /// the session, which took the job back to fail again, for ever, and nothing else went through).
    @Test func aJobWhoseHeadersFillItsFrameIsParkedWithTheWorkersOnly() throws {
        let h = try parking()
        defer { h.stop() }
        // 131,072-byte frames: the frame's own 22 bytes, the table's 4, the header's name, kind and length 11.
        let refused = #"{"id": "full", "payload": {"aps": {}}}"#
        #expect(try Self.pika(["publish-big", h.jobs, refused, "131030"]).first == "published")
        let token = String(repeating: "c9", count: 32)
        let after = #"{"id": "\#(TestServices.unique("after"))", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#
        try h.publisher.publish(to: h.jobs, body: Array(after.utf8), properties: AMQPProperties(replyTo: h.replies))
        #expect(try h.replyReader.read(1).count == 1, "the next job went through")
        let parked = try Self.pika(["names", h.failed])
        #expect(parked.first == "x-apns-worker-headers-left-out x-apns-worker-reason", "\(parked)")
        #expect(parked.dropFirst().first?.hasPrefix("1: ") == true, "\(parked)")
    }

    /// Properties no frame carries (a short string over 255 bytes, headers past the frame) are refused before anything
    /// is sent, and the connection goes on: librabbitmq failed half-way, after the publish method went out, and the
    /// broker closed the connection at the next frame.
    @Test func propertiesNoFrameCarriesAreRefusedBeforeAnythingIsSent() throws {
        let (jobs, _, _, publisher) = try TestServices.jobQueues()
        try publisher.enablePublisherConfirms()
        for properties in [
            AMQPProperties(correlationID: String(repeating: "c", count: 256)),
            AMQPProperties(headers: ["x-big": String(repeating: "b", count: 131_072)])
        ] {
            #expect(throws: AMQPError.self) { try publisher.publish(to: jobs, body: [1], properties: properties) }
            do { _ = try publisher.publish(to: jobs, body: [1], properties: properties) } catch {
                #expect(error.kind == .propertiesTooLarge, "\(error)")
            }
        }
        let sequence = try publisher.publish(
            to: jobs, body: [2], properties: AMQPProperties(correlationID: String(repeating: "c", count: 255)))
        #expect(try publisher.waitForConfirms(through: sequence).isEmpty, "the connection went on")
        #expect(try publisher.queueStatus(jobs)?.messages == 1)
    }

    /// A publisher that sets the republished header as a number (as pika, Go's amqp091 and Java's client do for an
    /// integer) has its copy recognised: nothing is sent twice.
    @Test func aCopyMarkedWithANumberSendsNothingTwice() throws {
        let simulator = try APNsSimulator(configuration: .init(), logger: logger)
        defer { simulator.shutdown() }
        let (jobs, replies, replyReader, publisher) = try TestServices.jobQueues()
        let workerThread = try WorkerThread(
            try TestServices.workerEnvironment(simulator: simulator, jobs: jobs), logger: logger)
        defer { workerThread.stop() }
        let token = String(repeating: "b8", count: 32)
        let job = #"{"id": "\#(TestServices.unique("copied"))", "tokens": ["\#(token)"], "payload": {"aps": {}}}"#
        try publisher.publish(to: jobs, body: Array(job.utf8), properties: AMQPProperties(replyTo: replies))
        #expect(try replyReader.read(1).count == 1, "the original was settled")
        #expect(try Self.pika(["publish", jobs, job, "republished"]).first == "published")
        let statistics = workerThread.worker.statistics
        #expect(TestServices.waitUntil { statistics.republishedCopiesSkipped.load(ordering: .relaxed) == 1 })
        #expect(simulator.received().filter { $0.deviceToken == token }.count == 1, "sent once")
    }
}
