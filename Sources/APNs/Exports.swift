// Whoever talks to APNs through this module speaks its vocabulary too (notifications, answers, reasons): one import.
@_exported import APNsModel
import HTTP2

/// The HTTP/2 client's header block is what an APNs answer's fields are read from.
extension HTTP2HeaderBlock: ReceivedHeaderFields {}

/// An HTTP CONNECT proxy for APNs traffic (APNS_PROXY_URL).
public typealias APNsProxy = HTTP2Proxy
