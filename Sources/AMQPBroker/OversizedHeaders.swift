import AMQP
import Telemetry
import WorkerPipeline

extension AMQPConnection {
    /// Publishes with `properties`, or, when they do not fit one frame (a message's own headers near the frame's
    /// size, with the worker's added to a copy of it), with the worker's own headers only and one saying how many of
    /// the others were left out: the copy is parked or retried without them rather than not at all. (Its publish
    /// ended the session, which took the job back to fail the same way, for ever.)
    public func publishKeepingWorkerHeaders(
        to queue: String, exchange: String = "", body: [UInt8], properties: AMQPProperties, mandatory: Bool = false,
        logger: Logger
    ) throws(AMQPError) -> UInt64 {
        do {
            return try publish(to: queue, exchange: exchange, body: body, properties: properties, mandatory: mandatory)
        } catch let error where error.kind == .propertiesTooLarge {
            // The worker's own, each within 8 KiB (a publisher may have written a large one under their names): the
            // eight of them fit the 128 KiB frame the worker asks for, so this publish goes.
            var trimmed = properties
            trimmed.headers = properties.headers.filter {
                Worker.ownHeaders.contains($0.key) && $0.value.utf8.count <= 8192
            }
            trimmed.otherHeaders = properties.otherHeaders.filter {
                Worker.ownHeaders.contains($0.name) && $0.entry.count <= 8192
            }
            let leftOut =
                properties.headers.count + properties.otherHeaders.count - trimmed.headers.count
                - trimmed.otherHeaders.count
            trimmed.headers[Worker.headersLeftOutHeader] =
                "\(leftOut): with the worker's they no longer fit one frame (\(error.message))"
            logger.warning(
                "a message's headers and the worker's no longer fit one frame: published with the worker's only",
                ["amqp.routing_key": queue, "amqp.headers_left_out": String(leftOut)])
            return try publish(to: queue, exchange: exchange, body: body, properties: trimmed, mandatory: mandatory)
        }
    }
}
