import Foundation
import HTTP2

/// The fields of a device push that APNs judges and the simulator records, read in one pass over the request's
/// header block with a String made only for the fields kept: a push needs a dozen of them, and each lookup on its own
/// walks every field and makes a String. As with `HTTP2HeaderBlock.value`, the first field of a name counts.
struct PushHeaders {
    var method = ""
    var path = ""
    var topic: String?
    var pushType: String?
    var priority: String?
    var id: String?
    var collapseID: String?
    var expiration: String?
    var authorization: String?

    init(_ request: HTTP2ServerRequest) {
        var seen: UInt16 = 0
        request.headerBlock.forEachField { name, value in
            guard let field = Self.field(named: name), seen & 1 << field.rawValue == 0 else { return true }
            seen |= 1 << field.rawValue
            let text = String(decoding: value, as: UTF8.self)
            switch field {
            case .method: method = text
            case .path: path = text
            case .topic: topic = text
            case .pushType: pushType = text
            case .priority: priority = text
            case .id: id = text
            case .collapseID: collapseID = text
            case .expiration: expiration = text
            case .authorization: authorization = text
            }
            return true
        }
    }

    private enum Field: Int {
        case method, path, topic, pushType, priority, id, collapseID, expiration, authorization
    }

    /// Which field `name` is: by its length first, so that most names are compared with one candidate or none.
    private static func field(named name: UnsafeBufferPointer<UInt8>) -> Field? {
        func matches(_ known: StaticString) -> Bool {
            memcmp(known.utf8Start, name.baseAddress!, name.count) == 0
        }
        switch name.count {
        case 5: return matches(":path") ? .path : nil
        case 7: return matches(":method") ? .method : matches("apns-id") ? .id : nil
        case 10: return matches("apns-topic") ? .topic : nil
        case 13: return matches("apns-priority") ? .priority : matches("authorization") ? .authorization : nil
        case 14: return matches("apns-push-type") ? .pushType : nil
        case 15: return matches("apns-expiration") ? .expiration : nil
        case 16: return matches("apns-collapse-id") ? .collapseID : nil
        default: return nil
        }
    }
}
