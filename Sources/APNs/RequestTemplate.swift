import Foundation
import HTTP2
import Synchronization
import TLS
import Telemetry
import Threads

extension APNsAuthentication {
    /// For logs and metrics: `TEAMID/KEYID`, or `certificate:<file name>`.
    public var name: String {
        switch self {
        case .token(let provider): "\(provider.teamID)/\(provider.keyID)"
        case .certificate(let file, _): "certificate:" + (file.split(separator: "/").last.map(String.init) ?? file)
        }
    }
}

/// The header fields that notifications of one job share, encoded once: a fan-out job's requests then share these
/// bytes, each with its own path (and a block of its own only with an apns-id), not a field-by-field encoding each.
struct RequestTemplate {
    /// What the cached fields were built from; a notification that differs rebuilds them.
    private var key: Key?

    private struct Key {
        var authority: String
        var authorization: String?
        var pushType: APNsPushType
        var topic: String
        var priority: APNsPriority
        var expiration: Int64?
        var collapseID: String?

        /// Compared in place: building a key per notification to compare with `==` copied five strings each time.
        func matches(_ notification: APNsNotification, authority: String, authorization: String?) -> Bool {
            pushType == notification.pushType && priority == notification.priority
                && expiration == notification.expiration && topic == notification.topic
                && collapseID == notification.collapseID && self.authority == authority
                && self.authorization == authorization
        }
    }
    /// :method, :scheme, :authority, then authorization, apns-push-type, apns-topic, apns-priority, apns-expiration,
    /// apns-collapse-id: every field but :path, shared by the requests of one kind (HTTP/2 sends :path first).
    private var fields = HTTP2HeaderBlock(capacity: 0)

    mutating func request(for notification: APNsNotification, authority: String, authorization: String?) -> HTTP2Request
    {
        if key?.matches(notification, authority: authority, authorization: authorization) != true {
            key = Key(
                authority: authority, authorization: authorization, pushType: notification.pushType,
                topic: notification.topic, priority: notification.priority, expiration: notification.expiration,
                collapseID: notification.collapseID)
            fields = APNsRequest.fields(
                .device(token: notification.deviceToken), authority: authority,
                authorization: authorization, capacity: 640)
            fields.add("apns-push-type", notification.pushType.rawValue)
            fields.add("apns-topic", notification.topic)
            fields.add("apns-priority", String(notification.priority.rawValue))
            if let expiration = notification.expiration { fields.add("apns-expiration", String(expiration)) }
            if let collapseID = notification.collapseID { fields.add("apns-collapse-id", collapseID) }
        }
        let route = APNsRoute.device(token: notification.deviceToken)
        let sendBy = notification.sendBy.map(Double.init) ?? .infinity
        guard let apnsID = notification.apnsID else {
            return APNsRequest.request(route, fields: fields, body: notification.payloadBytes, sendBy: sendBy)
        }
        // A job's own apns-id: a block of its own for this request (rare; a fan-out job cannot name one).
        var headers = fields
        headers.add("apns-id", apnsID, indexed: false)
        return APNsRequest.request(route, fields: headers, body: notification.payloadBytes, sendBy: sendBy)
    }
}
