import APNs
import Foundation
import HTTP2
import JSON
import Synchronization
import Telemetry
import Threads

/// What the simulator received: one accepted or rejected push, as APNs would have seen it.
public struct ReceivedNotification: Sendable, Equatable {
    public var deviceToken: String
    public var topic: String?
    public var pushType: String?
    public var priority: String?
    public var expiration: String?
    public var collapseID: String?
    public var apnsID: String
    public var payload: [UInt8]
    /// The status the simulator answered with.
    public var status: Int
    public var reason: String?
    public var connectionID: Int
    /// When it arrived, seconds since the epoch.
    public var receivedAt: Double
    /// Who sent it, as the connection proved it: `TEAMID/KEYID` of a verified provider token, or
    /// `certificate:<common name>` of a verified client certificate; nil when nothing is checked.
    public var credential: String? = nil
    /// The `iat` of the provider token the connection proved itself with, if it used one.
    public var tokenIssuedAt: Int64? = nil
}
