internal import CRabbitMQ
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// An error from the broker or from librabbitmq, with the library's status code where there is one.
public struct AMQPError: Error, Sendable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        case badURL
        /// The connection is gone (socket, heartbeat, broker closed it): reconnect.
        case connectionLost
        /// The broker closed the channel or refused a method (reply code in `code`).
        case brokerRefused
        /// A message whose properties do not fit one frame (its headers, mostly): refused before anything of it was
        /// sent, the connection is as it was. (librabbitmq would fail half-way, after the publish method went out,
        /// and the broker close the connection at the next frame.)
        case propertiesTooLarge
        /// Anything else librabbitmq reports.
        case library
    }

    public let kind: Kind
    /// librabbitmq's status (negative) or the broker's reply code (e.g. 406, 404, 320).
    public let code: Int
    public let message: String

    public var description: String { message }

    init(kind: Kind, code: Int = 0, _ message: String) {
        self.kind = kind
        self.code = code
        self.message = message
    }

    static func badURL(_ message: String) -> AMQPError { AMQPError(kind: .badURL, message) }

    /// Publishes the broker nacked: whoever published them must not acknowledge what caused them.
    public static func unconfirmed(_ what: String) -> AMQPError {
        AMQPError(kind: .brokerRefused, "\(what): the broker refused (nacked) a publish")
    }

    public var isConnectionLost: Bool { kind == .connectionLost }

    /// The broker refused this connection's own settings (ACCESS_REFUSED: user or password; NOT_ALLOWED: the vhost
    /// does not exist or the user may not use it), or the URL is wrong, or the broker's certificate is not one the CA
    /// bundle vouches for: waiting will not help, a setting must change.
    public var isPermanent: Bool { kind == .badURL || code == 403 || code == 530 || isCertificateRefused }

    /// The broker's TLS certificate failed verification against the CA bundle (AMQP_CA_FILE), or its name.
    public var isCertificateRefused: Bool {
        code == Int(AMQP_STATUS_SSL_PEER_VERIFY_FAILED.rawValue)
            || code == Int(AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED.rawValue)
    }
}

/// Message properties the worker reads and writes.
public struct AMQPProperties: Sendable, Equatable {
    // Optional fields spelled `Optional<T>` (CodeShapeTests.valuesMadePerJobSpellTheirOptionalsOut says why).
    public var contentType: Optional<String>
    public var replyTo: Optional<String>
    public var correlationID: Optional<String>
    public var messageID: Optional<String>
    public var persistent: Bool
    /// When the message was published, UNIX seconds (the AMQP timestamp property).
    public var timestamp: Optional<Int64>
    /// Headers whose values are UTF-8 text (AMQP long strings). When one is named in `otherHeaders` too, it is what
    /// is published.
    public var headers: [String: String]
    /// Every other header (`x-delivery-count` aside), as it came: published again with its type and value.
    public var otherHeaders: [AMQPEncodedHeader]
    /// How many times the broker delivered this message before (quorum queues say so in the integer header
    /// `x-delivery-count`); nil when the broker does not count. Read only: never published.
    public var deliveryCount: Optional<Int>
    /// The rest of what a publisher may say of a message, read and published as they are; nil when it said none of
    /// it (most messages), so that the properties every delivery carries stay small.
    public var more: Optional<AMQPMoreProperties>

    /// Whether a header of this name came with the message, of whatever type.
    public func hasHeader(_ name: String) -> Bool {
        headers[name] != nil || otherHeaders.contains { $0.name == name }
    }

    /// `application/json`, one string: read off the wire it is this one (`RecentNames`), so that comparing a
    /// message's content type with it is one comparison of the strings' words, not of their bytes.
    public static let jsonContentType = "application/json"

    public init(
        contentType: String? = AMQPProperties.jsonContentType, replyTo: String? = nil, correlationID: String? = nil,
        messageID: String? = nil, persistent: Bool = true, timestamp: Int64? = nil,
        headers: [String: String] = [:], otherHeaders: [AMQPEncodedHeader] = [], deliveryCount: Int? = nil,
        more: AMQPMoreProperties? = nil
    ) {
        self.deliveryCount = deliveryCount
        self.more = more
        self.otherHeaders = otherHeaders
        self.contentType = contentType
        self.replyTo = replyTo
        self.correlationID = correlationID
        self.messageID = messageID
        self.persistent = persistent
        self.timestamp = timestamp
        self.headers = headers
    }
}

/// `content_encoding`, `type`, `app_id`, `priority`. (`expiration` and `user_id` are not read: a copy published
/// again must not expire on its way, and the broker refuses a `user_id` other than the publishing connection's.)
public final class AMQPMoreProperties: Sendable, Equatable {
    public let contentEncoding: String?
    public let type: String?
    public let appID: String?
    public let priority: UInt8?

    public init(contentEncoding: String? = nil, type: String? = nil, appID: String? = nil, priority: UInt8? = nil) {
        self.contentEncoding = contentEncoding
        self.type = type
        self.appID = appID
        self.priority = priority
    }

    public static func == (left: AMQPMoreProperties, right: AMQPMoreProperties) -> Bool {
        (left.contentEncoding, left.type, left.appID, left.priority)
            == (right.contentEncoding, right.type, right.appID, right.priority)
    }
}

public struct AMQPDelivery: Sendable {
    public var deliveryTag: UInt64
    public var redelivered: Bool
    /// Which `consume` this came from, for a connection consuming several queues.
    public var consumerTag: String
    public var routingKey: String
    public var body: [UInt8]
    public var properties: AMQPProperties
}

/// What arrives on the connection.
public enum AMQPEvent: Sendable {
    case delivery(AMQPDelivery)
    /// Publisher confirm: the broker took (`ack`) or lost (`!ack`) publishes up to `sequence` (all of them if `multiple`).
    case confirm(sequence: UInt64, multiple: Bool, ack: Bool)
    /// The broker stopped (`true`) or resumed (`false`) accepting publishes (memory or disk alarm).
    case blocked(Bool)
}

/// A mandatory publish that no queue took (the queue was deleted, or nothing is bound to the exchange): the broker
/// hands it back before it confirms it, so it is known by the time `waitForConfirms` returns (`takeReturns`).
public struct AMQPReturn: Sendable, Equatable {
    public var exchange: String
    public var routingKey: String
    public var replyCode: Int
    public var replyText: String
}
