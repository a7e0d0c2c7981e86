import Foundation
import HTTP2
import JSON
import Synchronization
import TLS
import Telemetry
import Threads

/// How a channel keeps broadcasts for devices that are offline (Apple's `message-storage-policy`).
public enum APNsChannelStorage: Int, Sendable, CaseIterable {
    /// 0: nothing is stored; a broadcast's `apns-expiration` must be 0.
    case none = 0
    /// 1: the most recent message is kept (up to 8 hours).
    case mostRecent = 1

    public var name: String { self == .none ? "none" : "most-recent" }

    public init?(name: String) {
        guard let found = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = found
    }
}

/// What APNs answered a channel management request with, when it was not what was asked.
public enum APNsChannelError: Error, Sendable, Equatable, CustomStringConvertible {
    /// APNs refused: its status and reason (`ChannelNotRegistered`, `CannotCreateChannelConfig`, ...).
    case refused(status: Int, reason: String?)
    /// No answer (connection trouble, a timeout).
    case noAnswer(String)
    /// An answer that does not say what Apple's documentation says it would.
    case unexpected(String)

    public var description: String {
        switch self {
        case .refused(let status, let reason): "APNs refused: \(status) \(reason ?? "(no reason)")"
        case .noAnswer(let why): "no answer from APNs: \(why)"
        case .unexpected(let what): "unexpected answer from APNs: \(what)"
        }
    }

    /// Whether waiting and asking again may help.
    public var isTransient: Bool {
        switch self {
        case .noAnswer: true
        case .refused(let status, _): status == 429 || status >= 500
        case .unexpected: false
        }
    }
}

/// Apple's channel management API (iOS 18 broadcasts): the channels of an app, created, listed, read and deleted
/// (Apple: "Sending channel management requests to APNs"; hosts api-manage-broadcast.push.apple.com:2196 and
/// api-manage-broadcast.sandbox.push.apple.com:2195). Calls block the calling thread (a command-line tool's), never
/// a cooperative one; one connection, opened at the first call, with the credential that serves the app.
public final class APNsChannelClient: Sendable {
    private let client: HTTP2Client
    private let credential: APNsCredential
    private let timeout: Double

    public init(
        endpoint: APNsEndpoint, credential: APNsCredential, configuration: APNsClientConfiguration,
        logger: Logger
    ) throws {
        var tls = TLSClientConfiguration(caFile: configuration.caFile, verifyPeer: configuration.verifyPeer)
        if case .certificate(let certificate, let key) = credential.authentication {
            tls.certificateFile = certificate
            tls.privateKeyFile = key
        }
        // A request lost with its connection is not sent again: it may have created the channel.
        var settings = HTTP2Client.Configuration(
            host: endpoint.host, port: endpoint.port, tls: tls, connectionCount: 1,
            requestTimeout: configuration.requestTimeout, maximumAttempts: 1)
        settings.proxy = configuration.proxy
        client = try HTTP2Client(configuration: settings, logger: logger)
        self.credential = credential
        timeout = configuration.requestTimeout + 5
    }

    deinit { client.shutdown() }

    /// A new channel of `bundle`: its id.
    public func create(bundle: String, storage: APNsChannelStorage) throws(APNsChannelError) -> String {
        let body = "{\"message-storage-policy\":\(storage.rawValue),\"push-type\":\"LiveActivity\"}"
        let response = try call(.channels(bundle: bundle, .create), body: Array(body.utf8))
        return try APNsChannelAnswer.createdChannel(response.header("apns-channel-id"))
    }

    /// Every channel id of `bundle`.
    public func list(bundle: String) throws(APNsChannelError) -> [String] {
        let response = try call(.channels(bundle: bundle, .list))
        return try APNsChannelAnswer.channels(response.body)
    }

    /// How the channel keeps messages.
    public func show(bundle: String, channel: String) throws(APNsChannelError) -> APNsChannelStorage {
        let response = try call(.channels(bundle: bundle, .read), channel: channel)
        return try APNsChannelAnswer.storage(response.body)
    }

    public func delete(bundle: String, channel: String) throws(APNsChannelError) {
        _ = try call(.channels(bundle: bundle, .delete), channel: channel)
    }

    private func call(_ route: APNsRoute, channel: String? = nil, body: [UInt8] = []) throws(APNsChannelError)
        -> HTTP2Response
    {
        do throws(APNsRequestError) { try route.validate() } catch { throw .unexpected(error.description) }
        var headers: HTTP2HeaderBlock
        do {
            headers = APNsRequest.fields(
                route, authority: client.authority, authorization: try credential.authorization(),
                capacity: 512)
        } catch {
            throw .unexpected("cannot sign the provider token: \(error)")
        }
        if let channel { headers.add("apns-channel-id", channel) }
        if !body.isEmpty { headers.add("content-type", "application/json") }
        let answer = Locked<Result<HTTP2Response, HTTP2StreamError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        client.send(APNsRequest.request(route, fields: headers, body: body[...])) { result in
            answer.withLock { $0 = result }
            done.signal()
        }
        guard done.wait(timeout: .now() + timeout) == .success, let result = answer.withLock({ $0 }) else {
            throw .noAnswer("no answer within \(Int(timeout)) s")
        }
        switch result {
        case .failure(let error):
            throw .noAnswer(error.description)
        case .success(let response) where route.outcome(of: APNsResponse(status: response.status)) == .delivered:
            return response
        case .success(let response):
            throw APNsChannelAnswer.refusal(status: response.status, body: response.body)
        }
    }
}

/// What the channel management API's answers say, read as Apple documents them; anything else is `.unexpected`,
/// naming what is missing (never echoing the answer: it is shown to an operator's terminal).
package enum APNsChannelAnswer {
    /// The `apns-channel-id` header of a 201 to a create: a channel id as Apple issues them.
    package static func createdChannel(_ header: String?) throws(APNsChannelError) -> String {
        guard let id = header, !id.isEmpty else { throw .unexpected("201 without apns-channel-id") }
        do { try APNsChannelID.check(id) } catch {
            throw .unexpected("201 with an apns-channel-id that is no channel id")
        }
        return id
    }

    /// `{"channels": ["id", ...]}`: every id a channel id.
    package static func channels(_ body: [UInt8]) throws(APNsChannelError) -> [String] {
        guard let document = try? JSONReader.parse(body), case .array(let items)? = document["channels"] else {
            throw .unexpected("no \"channels\" list in the answer")
        }
        var ids: [String] = []
        ids.reserveCapacity(items.count)
        for (index, item) in items.enumerated() {
            guard case .string(let id) = item, (try? APNsChannelID.check(id)) != nil else {
                throw .unexpected("item \(index + 1) of \"channels\" is no channel id")
            }
            ids.append(id)
        }
        return ids
    }

    /// `{"message-storage-policy": 0 or 1}`.
    package static func storage(_ body: [UInt8]) throws(APNsChannelError) -> APNsChannelStorage {
        guard let document = try? JSONReader.parse(body), case .number(let text)? = document["message-storage-policy"],
            let storage = Int(text).flatMap(APNsChannelStorage.init(rawValue:))
        else {
            throw .unexpected("no \"message-storage-policy\" in the answer")
        }
        return storage
    }

    /// A status other than the one asked for: Apple's reason when the body gives one of its names.
    package static func refusal(status: Int, body: [UInt8]) -> APNsChannelError {
        // The reason is shown to an operator (a terminal, a log): control characters are dropped and it is bounded.
        .refused(status: status, reason: APNsResponse.parseBody(body).reason.map { Redact.outsideText($0.rawValue) })
    }
}
