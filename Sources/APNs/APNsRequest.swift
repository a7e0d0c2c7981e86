import HTTP2

/// The one writer of requests to APNs: the route's method and path, the pseudo-headers, the provider token. Device
/// pushes, broadcasts and channel management calls add their own `apns-*` fields after these.
enum APNsRequest {
    /// `:method`, `:scheme`, `:authority`, then `authorization`: what every request starts with (HTTP/2 sends
    /// `:path` first; it travels beside the block, `request(_:fields:body:)`).
    static func fields(_ route: APNsRoute, authority: String, authorization: String?, capacity: Int) -> HTTP2HeaderBlock
    {
        var fields = HTTP2HeaderBlock(capacity: capacity)
        fields.add(":method", route.method)
        fields.add(":scheme", "https")
        fields.add(":authority", authority)
        if let authorization { fields.add("authorization", authorization) }
        return fields
    }

    /// The request of `route` with these fields: the path is joined only when the request is submitted.
    static func request(
        _ route: APNsRoute, fields: HTTP2HeaderBlock, body: ArraySlice<UInt8>, sendBy: Double = .infinity
    ) -> HTTP2Request {
        let path = route.path
        return HTTP2Request(
            headers: fields, path: HTTP2Path(prefix: path.prefix, rest: path.rest), body: body, sendBy: sendBy)
    }
}

extension APNsCredential {
    /// The `authorization` field of its requests: a provider token, or nil with a client certificate (TLS
    /// authenticates the connection).
    func authorization() throws -> String? { try signature()?.authorization }

    /// The `authorization` field and its token's `iat`; nil with a client certificate.
    func signature() throws -> (authorization: String, issuedAt: Int64)? {
        guard case .token(let provider) = authentication else { return nil }
        return try provider.signature()
    }
}

extension APNsBroadcast {
    func request(authority: String, authorization: String?) -> HTTP2Request {
        let route = APNsRoute.broadcast(bundle: bundle)
        var fields = APNsRequest.fields(route, authority: authority, authorization: authorization, capacity: 512)
        fields.add("apns-channel-id", channelID)
        fields.add("apns-push-type", APNsPushType.liveactivity.rawValue)
        fields.add("apns-priority", String(priority.rawValue))
        fields.add("apns-expiration", String(expiration))
        return APNsRequest.request(
            route, fields: fields, body: payload[...], sendBy: sendBy.map(Double.init) ?? .infinity)
    }
}
