import APNsModel

/// The message properties the pipeline reads and writes: the contract's reply_to, correlation-id, message-id,
/// timestamp and headers.
///
/// Stored in an order that leaves no padding to speak of (`persistent` after `timestamp`): a `JobDelivery` holding
/// them then stays within the 120 bytes that glibc serves from its fast bins (`AllocationSizeTests` holds it): one
/// of the few objects every job allocates, many at a time.
public struct MessageProperties: Sendable, Equatable {
    // Optional fields spelled `Optional<T>` (CodeShapeTests.valuesMadePerJobSpellTheirOptionalsOut says why).
    public var replyTo: Optional<String>
    public var correlationID: Optional<String>
    public var messageID: Optional<String>
    /// When the message was published (UNIX seconds), if its publisher said so: how long a job waited in its lane.
    public var timestamp: Optional<Int64>
    public var persistent: Bool
    /// `deliveryCount`, in the bytes the timestamp and the flag leave before the next word (clamped: what is
    /// compared with it is WORKER_MAX_DELIVERIES, at most 1,000).
    @usableFromInline var deliveryCountStored: Optional<Int16>
    public var headers: MessageHeaders
    /// Deliveries of this message before this one, when the broker counts them (quorum queues); never published.
    public var deliveryCount: Int? {
        get { deliveryCountStored.map(Int.init) }
        set { deliveryCountStored = newValue.map { Int16(clamping: $0) } }
    }
    /// What else the publisher said of the message, kept as it came on every copy the worker publishes of a job (a
    /// retry, a parked copy, a part, a copy waiting for Redis); nil for most messages, whose content type is
    /// `application/json` or none (and which go out as `application/json`, as the worker's own messages do). In a
    /// box: a job's delivery stays within the allocator's fast bins (`AllocationSizeTests`).
    public var publisherProperties: Optional<PublisherProperties>

    /// The message-id as a job's id: none when it is empty, which any number of unrelated messages may carry.
    public var idForJob: String? { messageID?.isEmpty == false ? messageID : nil }

    /// Inlinable: the broker adapter makes one per job, and a call left a copy of the whole value behind.
    @inlinable
    public init(
        replyTo: String? = nil, correlationID: String? = nil, messageID: String? = nil, persistent: Bool = true,
        timestamp: Int64? = nil, headers: MessageHeaders = [:], deliveryCount: Int? = nil,
        publisherProperties: PublisherProperties? = nil
    ) {
        self.publisherProperties = publisherProperties
        deliveryCountStored = deliveryCount.map { Int16(clamping: $0) }
        self.replyTo = replyTo
        self.correlationID = correlationID
        self.messageID = messageID
        self.persistent = persistent
        self.timestamp = timestamp
        self.headers = headers
    }
}

/// A message's headers: those the pipeline reads and writes are text; any other (a number, a flag, a table, bytes,
/// as a publisher or the broker wrote it) is carried as the broker encoded it, so that what is published again from
/// a job (its retries, its parked copy) keeps every header, of whatever type, unchanged.
public struct MessageHeaders: Sendable, Equatable, ExpressibleByDictionaryLiteral {
    /// A header's value.
    public enum Field: Sendable, Equatable {
        case text(String)
        /// The broker's encoding of a header that is not text, which only the broker adapter reads.
        case encoded([UInt8])
    }

    private var values: [String: Field]

    public init() { values = [:] }

    public init(_ text: [String: String]) { values = text.mapValues { .text($0) } }

    public init(dictionaryLiteral elements: (String, String)...) {
        values = Dictionary(elements.map { ($0.0, Field.text($0.1)) }, uniquingKeysWith: { _, last in last })
    }

    public var isEmpty: Bool { values.isEmpty }

    /// A header's text: nil when the message has no such header, or has it with a value that is not text.
    /// Setting it replaces the header whatever its type; nil removes it.
    public subscript(name: String) -> String? {
        get {
            guard !values.isEmpty, case .text(let text) = values[name] else { return nil }
            return text
        }
        set { values[name] = newValue.map { .text($0) } }
    }

    /// Whether the message has a header of this name, of whatever type.
    public func contains(_ name: String) -> Bool { !values.isEmpty && values[name] != nil }

    /// Every header, by name (changed in place: a setter would copy the dictionary for each header set).
    public var all: [String: Field] {
        get { values }
        _modify { yield &values }
    }
}

/// A job as the broker handed it over. `tag` is the broker's handle for settling it; the pipeline only gives it back.
/// Never changed once received, and a class: a delivery travels with its job through several arrays, filters and
/// hand-overs, where a copy then costs one reference count instead of one per string and array it holds.
public final class JobDelivery: Sendable {
    // In this order, the one-byte fields last, the object fits glibc's fast bins (see `MessageProperties`).
    public let tag: UInt64
    public let body: [UInt8]
    public let properties: MessageProperties
    public let redelivered: Bool
    public let lane: JobLane

    public init(
        tag: UInt64, redelivered: Bool, body: consuming [UInt8], properties: consuming MessageProperties,
        lane: JobLane = .urgent
    ) {
        self.tag = tag
        self.redelivered = redelivered
        self.body = body
        self.properties = properties
        self.lane = lane
    }
}

/// What arrives from the broker.
public enum BrokerNotice: Sendable {
    case delivery(JobDelivery)
    /// The broker stopped (`true`) or resumed (`false`) taking publishes (a memory or disk alarm).
    case publishingBlocked(Bool)
}

/// One message a finished job produces.
public struct Publication: Sendable {
    public enum Destination: Hashable, Sendable {
        /// The dead-token events' exchange and queue.
        case deadTokens
        /// Jobs parked for people to look at.
        case failed
        /// The delay queue that holds a retry `delay` seconds before it comes back as a job, in the lane it came from.
        case retry(delay: Double, lane: JobLane)
        /// A job's sender, by its reply_to.
        case reply(String)
    }

    public var destination: Destination
    public var body: [UInt8]
    public var properties: MessageProperties

    public init(destination: Destination, body: [UInt8], properties: MessageProperties) {
        self.destination = destination
        self.body = body
        self.properties = properties
    }
}

/// What became of one publication, once the broker confirmed it or handed it back.
public enum PublicationOutcome: Sendable, Equatable {
    case taken
    /// No queue took it (deleted at run time, or never declared): the broker handed it back.
    case noQueue
    /// The broker refused it (a negative confirm).
    case refused
}

/// Both lanes' queues at one moment: messages waiting (ready, not delivered) and consumers.
public struct LaneQueues: Sendable, Equatable {
    public var messages: LaneCounts
    public var consumers: LaneCounts

    public init(messages: LaneCounts, consumers: LaneCounts) {
        self.messages = messages
        self.consumers = consumers
    }
}

/// A message's `content_type` (when not `application/json`), `content_encoding`, `type`, `app_id` and `priority`.
public final class PublisherProperties: Sendable, Equatable {
    public let contentType: String?
    public let contentEncoding: String?
    public let type: String?
    public let appID: String?
    public let priority: UInt8?

    public init(
        contentType: String?, contentEncoding: String? = nil, type: String? = nil, appID: String? = nil,
        priority: UInt8? = nil
    ) {
        self.contentType = contentType
        self.contentEncoding = contentEncoding
        self.type = type
        self.appID = appID
        self.priority = priority
    }

    /// The content type of a message the worker publishes: a job's own, or `application/json`.
    public static func contentType(of properties: PublisherProperties?) -> String? {
        guard let properties else { return "application/json" }
        return properties.contentType
    }

    public static func == (left: PublisherProperties, right: PublisherProperties) -> Bool {
        (left.contentType, left.contentEncoding, left.type, left.appID, left.priority)
            == (right.contentType, right.contentEncoding, right.type, right.appID, right.priority)
    }
}
