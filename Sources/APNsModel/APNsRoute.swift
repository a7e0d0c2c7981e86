/// The requests APNs takes, each with its method, its path built from checked parts, and its own answer table:
/// what a status means depends on what was asked (a 410 to a device push is a dead token; to a broadcast it is
/// a failure that removes nothing).
public enum APNsRoute: Sendable, Equatable {
    /// `POST /3/device/<token>`: a notification to one device token (or a Live Activity's token).
    case device(token: String)
    /// `POST /4/broadcasts/apps/<bundle ID>` with `apns-channel-id`: a broadcast to a channel's subscribers (iOS 18).
    case broadcast(bundle: String)
    /// Apple's channel management API (`/1/apps/<bundle ID>/...`).
    case channels(bundle: String, ChannelCall)

    /// A call of the channel management API.
    public enum ChannelCall: Sendable, Equatable {
        /// `POST .../channels`: a new channel (201).
        case create
        /// `GET .../channels` with `apns-channel-id`: how the channel stores messages (200).
        case read
        /// `DELETE .../channels` with `apns-channel-id` (204).
        case delete
        /// `GET .../all-channels`: every channel id of the app (200).
        case list
    }

    public var method: String {
        switch self {
        case .device, .broadcast: "POST"
        case .channels(_, .create): "POST"
        case .channels(_, .read), .channels(_, .list): "GET"
        case .channels(_, .delete): "DELETE"
        }
    }

    /// The path as a part many requests share and a part of their own (for a device push, the token: the part
    /// built per notification is no string of its own).
    public var path: (prefix: String, rest: String) {
        switch self {
        case .device(let token): ("/3/device/", token)
        case .broadcast(let bundle): ("/4/broadcasts/apps/", bundle)
        case .channels(let bundle, .list): ("/1/apps/", bundle + "/all-channels")
        case .channels(let bundle, _): ("/1/apps/", bundle + "/channels")
        }
    }

    /// The parts that make the path, checked: a device token is hex (APNsNotification), a bundle ID is a bundle ID,
    /// so that no part of a job can add a segment, a query or a fragment to the request.
    public func validate() throws(APNsRequestError) {
        switch self {
        case .device(let token): _ = try APNsNotification.validateDeviceToken(token)
        case .broadcast(let bundle), .channels(let bundle, _): try APNsRules.checkTopic(bundle, field: "\"topic\"")
        }
    }

    /// The status a channel management call answers when it did what was asked.
    public var expectedStatus: Int {
        switch self {
        case .device, .broadcast, .channels(_, .read), .channels(_, .list): 200
        case .channels(_, .create): 201
        case .channels(_, .delete): 204
        }
    }

    /// What an answer to this route means.
    public func outcome(of response: APNsResponse) -> APNsOutcome { answers.outcome(of: response) }

    /// The route's answer table (what its answers mean depends on the kind of route, not on its token or bundle).
    public var answers: AnswerTable {
        switch self {
        case .device: .device
        case .broadcast, .channels: .namingNoDevice(expectedStatus: expectedStatus)
        }
    }

    /// What a status and reason mean for a route: kept apart from the route so that reading an answer builds no
    /// route (on the device route, once per notification).
    public enum AnswerTable: Sendable, Equatable {
        /// Apple's device push answers (`APNsOutcome.classify`), a dead token included.
        case device
        /// A request that names no device token: `expectedStatus` is success, nothing is a dead token.
        case namingNoDevice(expectedStatus: Int)

        public func outcome(of response: APNsResponse) -> APNsOutcome {
            guard case .namingNoDevice(let expectedStatus) = self else { return APNsOutcome.classify(response) }
            if response.status == expectedStatus { return .delivered }
            let outcome = APNsOutcome.classify(response)
            return outcome == .deadToken || outcome == .delivered ? .permanentFailure : outcome
        }
    }
}
