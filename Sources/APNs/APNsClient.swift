import Foundation
import HTTP2
import Synchronization
import TLS
import Telemetry
import Threads

/// Sends notifications over persistent HTTP/2 connections: one pool per credential, environment and traffic class,
/// each opened when first needed, and one event loop (thread) per traffic class: writing a large bulk batch or
/// reading a burst of bulk answers never holds up an urgent request on its way out, and the bulk thread runs at a
/// lower priority (`BulkThread`).
///
/// A notification's topic picks its credential (`APNsCredentials`); `replaceCredentials` swaps them at run time: the
/// pools of credentials that changed take no new requests, finish their streams and close, and new ones open on
/// demand.
public final class APNsClient: Sendable {
    public let configuration: APNsClientConfiguration
    private let credentials: Locked<APNsCredentials>
    private let logger: Logger
    private let urgentLoop: EventLoop
    private let bulkLoop: EventLoop
    private let pools = Locked<[PoolKey: Pool]>([:])
    /// Open connections per credential name, environment and traffic class, for `/metrics`.
    private let openConnections = Locked<[ConnectionLabels: Int]>([:])
    /// When the pool of a key was last replaced after a 403 "bound to another key" (uptime nanoseconds).
    private let replacedPools = Locked<[PoolKey: UInt64]>([:])

    private struct PoolKey: Hashable {
        var credential: ObjectIdentifier
        var environment: APNsEnvironment
        var traffic: JobLane
    }

    private struct Pool {
        /// Held so that the key's identifier cannot be reused while the pool is in the table.
        var credential: APNsCredential
        var client: HTTP2Client
        /// When a 403 saying the connection is bound to another key replaced the pool before it (uptime nanoseconds).
        var replacedAt: UInt64?
        /// A request was leased from it since `takeSendingPools` last asked.
        var sentSinceAsked = false
    }

    public struct ConnectionLabels: Hashable, Sendable {
        public var credential: String
        public var environment: APNsEnvironment
        public var traffic: JobLane
    }

    /// A pool replaced after a 403 "bound to another key" is not replaced again within this many seconds: a
    /// credential APNs keeps refusing is then answered with the 403 rather than reconnecting in a loop.
    static let replacementInterval: Double = 10

    public init(configuration: APNsClientConfiguration, credentials: APNsCredentials, logger: Logger) {
        self.configuration = configuration
        self.credentials = Locked(credentials)
        self.logger = logger
        urgentLoop = EventLoop(name: "apns-urgent")
        bulkLoop = EventLoop(name: "apns-bulk", bulkWork: true)
        if !configuration.verifyPeer {
            logger.critical(
                "TLS peer verification is OFF for APNs: anyone on the path can read and forge pushes",
                ["tls.verify": "false"])
        }
    }

    /// One credential for every topic.
    public convenience init(configuration: APNsClientConfiguration, authentication: APNsAuthentication, logger: Logger)
    {
        let credential = APNsCredential(
            name: authentication.name, authentication: authentication, bundles: [],
            material: [])
        // Cannot throw: no bundle is listed.
        self.init(
            configuration: configuration, credentials: try! APNsCredentials(entries: [], fallback: credential),
            logger: logger)
    }

    private func loop(_ traffic: JobLane) -> EventLoop { traffic == .urgent ? urgentLoop : bulkLoop }

    /// The credential that sends `topic` now, if any.
    public func credential(forTopic topic: String) -> APNsCredential? {
        credentials.withLock { $0.credential(forTopic: topic) }
    }

    public var currentCredentials: APNsCredentials { credentials.withLock { $0 } }

    /// Sends a batch. `completion` runs once per notification with its index, always on the loop thread of `traffic`:
    /// keep it short. Notifications that break Apple's rules, or whose topic no credential serves, are answered
    /// without a request. Returns how many went to the connections (the others are answered without a request).
    @discardableResult
    public func send(
        _ notifications: [APNsNotification],
        traffic: JobLane = .urgent, completion: @escaping @Sendable (Int, APNsResult) -> Void
    ) -> Int {
        send(notifications, traffic: traffic, resending: false, completion: completion)
    }

    /// `resending`: the notifications were sent once already and APNs asked for a new provider token or new
    /// connections; they are sent once more, and the same answer again is theirs (no second token, no loop).
    private func send(
        _ notifications: [APNsNotification], traffic: JobLane, resending: Bool,
        completion: @escaping @Sendable (Int, APNsResult) -> Void
    ) -> Int {
        // Answers that need no request still arrive on the loop thread, like every other answer.
        var immediate: [(Int, APNsResult)] = []
        defer {
            if !immediate.isEmpty {
                let answers = immediate
                loop(traffic).execute { for (index, result) in answers { completion(index, result) } }
            }
        }
        // A job's notifications share a topic: one lookup per run of equal topics, and no grouping when the whole
        // batch has one credential (the common case). Indices nil: every notification.
        guard let first = notifications.first else { return 0 }
        let firstCredential = credential(forTopic: first.topic)
        var groups: [(credential: APNsCredential?, indices: [Int]?)] = [(firstCredential, nil)]
        var lastTopic = first.topic
        for index in notifications.indices.dropFirst() {
            let topic = notifications[index].topic
            guard topic != lastTopic else { continue }
            lastTopic = topic
            if credential(forTopic: topic) !== firstCredential {
                groups = Self.grouped(notifications, credential: credential(forTopic:)).map {
                    ($0.credential, $0.indices)
                }
                break
            }
        }
        for (credential, indices) in groups {
            guard let credential else {
                immediate += (indices ?? Array(notifications.indices)).map {
                    (
                        $0,
                        APNsResult(
                            outcome: .unserved, error: "no APNs credential serves topic " + notifications[$0].topic)
                    )
                }
                continue
            }
            send(
                notifications, indices, credential: credential, traffic: traffic, resending: resending,
                immediate: &immediate, completion: completion)
        }
        return notifications.count - immediate.count
    }

    /// The notifications' positions by the credential that sends their topic (nil: none does), one lookup per run
    /// of equal topics.
    private static func grouped(
        _ notifications: [APNsNotification],
        credential: (String) -> APNsCredential?
    ) -> [(credential: APNsCredential?, indices: [Int])] {
        var groups: [(credential: APNsCredential?, indices: [Int])] = []
        var lastTopic: String?
        var lastGroup = 0
        for index in notifications.indices {
            let topic = notifications[index].topic
            if topic != lastTopic {
                lastTopic = topic
                let found = credential(topic)
                if let existing = groups.firstIndex(where: { $0.credential === found }) {
                    lastGroup = existing
                } else {
                    groups.append((found, []))
                    lastGroup = groups.count - 1
                }
            }
            groups[lastGroup].indices.append(index)
        }
        return groups
    }

    /// What sending with a credential in an environment takes: its pool of connections and its provider token.
    private struct Lease {
        var pool: HTTP2Client
        var key: PoolKey
        var authorization: String?
        /// The `iat` of the token in `authorization`: a refusal of it replaces it only if it is still the one in use.
        var issuedAt: Int64?
    }

    private enum Leasing {
        case leased(Lease)
        /// What every request gets instead, unsent.
        case answered(APNsResult)
    }

    /// The pool (opened if needed) and the signature for requests of `credential` in `environment` on `traffic`'s
    /// connections: the one place device pushes and broadcasts get them.
    private func lease(_ credential: APNsCredential, _ environment: APNsEnvironment, _ traffic: JobLane) -> Leasing {
        let signature: (authorization: String, issuedAt: Int64)?
        do { signature = try credential.signature() } catch {
            logger.critical(
                "cannot sign the APNs provider token", ["apns.credential": credential.name, "error": "\(error)"])
            return .answered(APNsResult(outcome: .permanentFailure, error: "\(error)"))
        }
        let key = PoolKey(credential: ObjectIdentifier(credential), environment: environment, traffic: traffic)
        do {
            guard let pool = try self.pool(for: key, credential, sending: true) else {
                // Replaced between the lookup and now: the new credentials decide.
                return .answered(APNsResult(outcome: .retryLater(delay: 0), error: "APNs credentials reloaded"))
            }
            return .leased(
                Lease(pool: pool, key: key, authorization: signature?.authorization, issuedAt: signature?.issuedAt))
        } catch {
            return .answered(APNsResult(outcome: .permanentFailure, error: "\(error)"))
        }
    }

    /// Sends the notifications at `indices` (nil: all of them), all of one credential.
    private func send(
        _ notifications: [APNsNotification], _ indices: [Int]?, credential: APNsCredential, traffic: JobLane,
        resending: Bool, immediate: inout [(Int, APNsResult)], completion: @escaping @Sendable (Int, APNsResult) -> Void
    ) {
        for environment in APNsEnvironment.allCases {
            let inEnvironment =
                indices.map { $0.filter { notifications[$0].environment == environment } }
                ?? notifications.indices.filter { notifications[$0].environment == environment }
            guard !inEnvironment.isEmpty else { continue }
            let lease: Lease
            switch self.lease(credential, environment, traffic) {
            case .leased(let leased): lease = leased
            case .answered(let result):
                immediate += inEnvironment.map { ($0, result) }
                continue
            }
            let (pool, authorization) = (lease.pool, lease.authorization)
            var requests: [HTTP2Request] = []
            var sendable: [Int] = []
            var template = RequestTemplate()
            requests.reserveCapacity(inEnvironment.count)
            // The last notification validated whole: those sharing its fields (all of a job's, and the single-token
            // jobs of one sender) need only their own checked. Each notification is taken out of the array once:
            // every call on one read in place would copy it again (reference counts).
            var validated: APNsNotification?
            for index in inEnvironment {
                let notification = notifications[index]
                do throws(APNsRequestError) {
                    if let validated, notification.sharesFields(with: validated) {
                        try notification.validateOwnFields()
                    } else {
                        try notification.validate()
                        validated = notification
                    }
                } catch {
                    immediate.append((index, APNsResult(outcome: .permanentFailure, error: error.description)))
                    continue
                }
                requests.append(
                    template.request(for: notification, authority: pool.authority, authorization: authorization))
                sendable.append(index)
            }
            guard !requests.isEmpty else { continue }
            let sentIndices = sendable
            let retry: @Sendable (Int) -> Void = { [self] position in
                let original = sentIndices[position]
                _ = send([notifications[original]], traffic: traffic, resending: true) { _, result in
                    completion(original, result)
                }
            }
            pool.send(requests) { [self] position, result in
                let answer = interpret(result, answers: .device, environment: environment, credential: credential)
                if sendsAgain(after: result, answer, lease: lease, credential: credential, resending: resending) {
                    retry(position)
                } else {
                    completion(sentIndices[position], answer)
                }
            }
        }
    }

    /// Sends one broadcast (iOS 18) with the credential that serves its bundle, on the push connections of
    /// `traffic` (the same host as device pushes); `completion` runs once, on that lane's loop thread. A broadcast
    /// that breaks Apple's rules, or whose bundle no credential serves, is answered without a request.
    public func send(
        _ broadcast: APNsBroadcast, environment: APNsEnvironment, traffic: JobLane = .urgent,
        completion: @escaping @Sendable (APNsResult) -> Void
    ) {
        send(broadcast, environment: environment, traffic: traffic, resending: false, completion: completion)
    }

    /// `resending`: as for device notifications.
    private func send(
        _ broadcast: APNsBroadcast, environment: APNsEnvironment, traffic: JobLane, resending: Bool,
        completion: @escaping @Sendable (APNsResult) -> Void
    ) {
        let loop = loop(traffic)
        func answer(_ result: APNsResult) { loop.execute { completion(result) } }
        do throws(APNsRequestError) { try broadcast.validate() } catch {
            return answer(APNsResult(outcome: .permanentFailure, error: error.description))
        }
        guard let credential = credential(forTopic: broadcast.bundle) else {
            return answer(APNsResult(outcome: .unserved, error: "no APNs credential serves topic \(broadcast.bundle)"))
        }
        let lease: Lease
        switch self.lease(credential, environment, traffic) {
        case .leased(let leased): lease = leased
        case .answered(let result): return answer(result)
        }
        let pool = lease.pool
        pool.send(broadcast.request(authority: pool.authority, authorization: lease.authorization)) { [self] result in
            let outcome = interpret(
                result, answers: APNsRoute.broadcast(bundle: broadcast.bundle).answers,
                environment: environment,
                credential: credential)
            if sendsAgain(after: result, outcome, lease: lease, credential: credential, resending: resending) {
                send(broadcast, environment: environment, traffic: traffic, resending: true, completion: completion)
            } else {
                completion(outcome)
            }
        }
    }

    /// Whether an answer is cured by sending the request again at once: it never left a pool that a reload drained,
    /// the provider token expired (and may be replaced now), or the connection is bound to another key (replaced now).
    private func sendsAgain(
        after result: Result<HTTP2Response, HTTP2StreamError>, _ answer: APNsResult, lease: Lease,
        credential: APNsCredential, resending: Bool
    ) -> Bool {
        let (pool, key) = (lease.pool, lease.key)
        // Refused or never sent: certainly not processed, so safe to send on the pool that replaced this one.
        switch result {
        case .failure(.notSent), .failure(.refused): if !isCurrent(pool, key) { return true }
        default: break
        }
        // A new token or new connections are tried once: the same answer again goes to the caller's retries.
        guard !resending else { return false }
        switch answer.outcome {
        case .refreshTokenAndRetry:
            guard case .token(let provider) = credential.authentication, provider.invalidate(refused: lease.issuedAt)
            else { return false }
            logger.warning(
                "APNs says the provider token expired: sending again with a new one",
                ["apns.credential": credential.name])
            return true
        case .replaceConnectionAndRetry:
            guard replace(pool, key) else { return false }
            logger.warning(
                "APNs says the connection is bound to another key: replacing its connections and sending again",
                ["apns.credential": credential.name, "apns.environment": key.environment.rawValue])
            return true
        default:
            return false
        }
    }

    /// Whether the caller runs on the loop thread of `traffic`.
    public func isOnLoopThread(of traffic: JobLane) -> Bool { loop(traffic).inEventLoop }

    /// Runs `action` on the loop thread of `traffic` after `delay` seconds: for work that belongs with its answers
    /// (which `send`'s completions deliver on that thread), such as handing a batch of them on.
    public func schedule(after delay: Double, traffic: JobLane = .urgent, _ action: @escaping @Sendable () -> Void) {
        let loop = loop(traffic)
        if loop.inEventLoop {
            loop.schedule(after: delay, action)
        } else {
            loop.execute { [loop] in loop.schedule(after: delay, action) }
        }
    }

    /// Sends with `replacement` from now on. Credentials that did not change keep their connections; the pools of
    /// the others stop taking requests, finish their streams and close. Returns the names of the credentials added
    /// and retired.
    @discardableResult
    public func replaceCredentials(_ replacement: APNsCredentials) -> (added: [String], retired: [String]) {
        let (before, after) = credentials.withLock { current in
            let before = current
            current = current.keepingUnchanged(replacement)
            return (before, current)
        }
        let live = Set(after.all.map(ObjectIdentifier.init))
        let retiredPools = pools.withLock { pools in
            let retired = pools.filter { !live.contains($0.key.credential) }
            for key in retired.keys { pools[key] = nil }
            replacedPools.withLock { replaced in replaced = replaced.filter { live.contains($0.key.credential) } }
            return retired.values.map(\.client)
        }
        for pool in retiredPools { pool.drain() }
        Self.forgetRetiredSeries(openConnections, credentials)
        let kept = Set(before.all.map(ObjectIdentifier.init))
        return (
            after.all.filter { !kept.contains(ObjectIdentifier($0)) }.map(\.name),
            before.all.filter { !live.contains(ObjectIdentifier($0)) }.map(\.name)
        )
    }

    public func shutdown() {
        let all = pools.withLock { Array($0.values) }
        for pool in all { pool.client.shutdown() }
        urgentLoop.shutdown()
        bulkLoop.shutdown()
    }

    /// Open connections by credential, environment and traffic class.
    public var connectionCounts: [ConnectionLabels: Int] { openConnections.withLock { $0 } }

    /// Streams in use by credential, environment and traffic class (as of the last second), for every pool.
    public var streamsInUse: [ConnectionLabels: Int] {
        pools.withLock { pools in
            var counts: [ConnectionLabels: Int] = [:]
            for (key, pool) in pools {
                let labels = ConnectionLabels(
                    credential: pool.credential.name, environment: key.environment,
                    traffic: key.traffic)
                counts[labels, default: 0] += pool.client.streamsInUse
            }
            return counts
        }
    }

    /// The series of credentials a reload retired go once their last connection closed: /metrics names the
    /// credentials in use (a current one's series stays, at 0 while it has no connection).
    private static func forgetRetiredSeries(
        _ openConnections: Locked<[ConnectionLabels: Int]>,
        _ credentials: Locked<APNsCredentials>
    ) {
        let current = Set(credentials.withLock { $0.all.map(\.name) })
        openConnections.withLock { counts in
            for (labels, count) in counts where count <= 0 && !current.contains(labels.credential) {
                counts[labels] = nil
            }
        }
    }

    /// An answer as its route's table reads it.
    private func interpret(
        _ result: Result<HTTP2Response, HTTP2StreamError>, answers: APNsRoute.AnswerTable,
        environment: APNsEnvironment, credential: APNsCredential
    ) -> APNsResult {
        switch result {
        case .success(let http):
            let body: (reason: APNsReason?, timestamp: Int64?) =
                http.status == 200
                ? (nil, nil)
                : APNsResponse.parseBody(http.body)
            let response = APNsResponse(
                status: http.status, fields: http.headerBlock, reason: body.reason,
                timestamp: body.timestamp)
            if APNsOutcome.isConfigurationError(response) {
                logger.error(
                    "APNs rejected the credentials or topic: fix the configuration",
                    [
                        "apns.status": String(http.status),
                        "apns.reason": Redact.outsideText(response.reason?.rawValue ?? ""),
                        "apns.environment": environment.rawValue, "apns.credential": credential.name
                    ])
            }
            let outcome = answers.outcome(of: response)
            // Moved into the result, not copied (a copy counts the references of its strings and header fields).
            return APNsResult(outcome: outcome, answer: consume response)
        case .failure(.sendByPassed):
            return APNsResult(outcome: .expired, error: HTTP2StreamError.sendByPassed.description)
        case .failure(let error):
            return APNsResult(outcome: .retryLater(delay: 1), error: error.description)
        }
    }

    /// Opens the environment's connections for `traffic` now rather than at the first notification, for every
    /// credential (those open already stay as they are): readiness can wait for them, and no credential's first push
    /// pays for the handshakes.
    public func connect(_ environment: APNsEnvironment, _ traffic: JobLane = .urgent) {
        for credential in credentials.withLock({ $0.all }) { connect(credential, environment, traffic) }
    }

    /// Opens the connections of the credential called `name` (`TEAMID/KEYID` or `certificate:<file name>`), if one
    /// is, in `environment` for `traffic` now.
    public func connect(credentialNamed name: String, _ environment: APNsEnvironment, _ traffic: JobLane = .urgent) {
        guard let credential = credentials.withLock({ $0.all.first { $0.name == name } }) else { return }
        connect(credential, environment, traffic)
    }

    private func connect(_ credential: APNsCredential, _ environment: APNsEnvironment, _ traffic: JobLane) {
        let key = PoolKey(credential: ObjectIdentifier(credential), environment: environment, traffic: traffic)
        do { _ = try pool(for: key, credential) } catch {
            logger.error(
                "cannot set up APNs connections",
                [
                    "apns.environment": environment.rawValue,
                    "apns.traffic": traffic.rawValue,
                    "apns.credential": credential.name, "error": "\(error)"
                ])
        }
    }

    private func isCurrent(_ pool: HTTP2Client, _ key: PoolKey) -> Bool {
        pools.withLock { $0[key]?.client === pool }
    }

    /// After a 403 saying the connection is bound to another key: the pool leaves the table (it finishes its streams
    /// and closes; the next request opens a fresh one), unless the pool of this key was replaced for the same reason
    /// within `replacementInterval`. Whether the request may go again.
    private func replace(_ pool: HTTP2Client, _ key: PoolKey) -> Bool {
        let now = DispatchTime.now().uptimeNanoseconds
        let retired: HTTP2Client?? = pools.withLock { pools in
            // Already replaced (by another answer, or a reload): send again on what is current.
            guard let entry = pools[key], entry.client === pool else { return .some(nil) }
            if let last = entry.replacedAt, Double(now &- last) / 1e9 < Self.replacementInterval { return nil }
            pools[key] = nil
            replacedPools.withLock { $0[key] = now }
            return .some(pool)
        }
        guard let retired else { return false }
        retired?.drain()
        return true
    }

    /// Notifications the pools of `traffic` can carry at once (`HTTP2Client.streamCapacity`, summed); before the
    /// lane has a pool, what its first will take before its server's SETTINGS (the bulk lane's opens at its first job,
    /// which must not find the whole of WORKER_MAX_IN_FLIGHT open).
    public func streamCapacity(_ traffic: JobLane) -> Int? {
        pools.withLock { pools in
            let lanePools = pools.filter { $0.key.traffic == traffic }.values
            guard !lanePools.isEmpty else {
                return configuration.maximumConnectionsPerEnvironment * HTTP2Client.streamLimitBeforeSettings
            }
            return lanePools.reduce(0) { $0 + $1.client.streamCapacity }
        }
    }

    /// The credentials (by name) and environments that sent since this was last asked, on either lane.
    public func takeSendingPools() -> Set<ConnectionLabels> {
        pools.withLock { pools in
            var sending: Set<ConnectionLabels> = []
            for (key, pool) in pools where pool.sentSinceAsked {
                sending.insert(
                    ConnectionLabels(
                        credential: pool.credential.name, environment: key.environment,
                        traffic: key.traffic))
                pools[key]?.sentSinceAsked = false
            }
            return sending
        }
    }

    /// The pool of `key`, opened if needed; nil if `credential` was replaced meanwhile. `sending`: a request is
    /// leased from it (noted for `takeSendingPools`).
    private func pool(for key: PoolKey, _ credential: APNsCredential, sending: Bool = false) throws -> HTTP2Client? {
        try pools.withLock { pools in
            if let pool = pools[key], pool.credential === credential {
                if sending && !pool.sentSinceAsked { pools[key]?.sentSinceAsked = true }
                return pool.client
            }
            // Checked under the pools' lock: `replaceCredentials` swaps the credentials before it sweeps the pools,
            // so a pool made here either sees the new credentials or is swept.
            guard credentials.withLock({ current in current.all.contains { $0 === credential } }) else { return nil }
            let (environment, traffic) = (key.environment, key.traffic)
            let poolConfiguration = poolConfiguration(for: key, credential)
            let client = try HTTP2Client(
                configuration: poolConfiguration,
                loop: loop(traffic),
                logger: logger.child(
                    "apns",
                    metadata: [
                        "apns.environment": environment.rawValue,
                        "apns.traffic": traffic.rawValue,
                        "apns.credential": credential.name
                    ]))
            pools[key] = Pool(
                credential: credential, client: client, replacedAt: replacedPools.withLock { $0[key] },
                sentSinceAsked: sending)
            return client
        }
    }

    /// How the connections of `key` are made (`APNsClientConfiguration.connections`), their openings and closings
    /// counted by credential, environment and lane (`openConnections`).
    private func poolConfiguration(for key: PoolKey, _ credential: APNsCredential) -> HTTP2Client.Configuration {
        let (environment, traffic) = (key.environment, key.traffic)
        var poolConfiguration = configuration.connections(to: environment, as: credential.authentication)
        let labels = ConnectionLabels(credential: credential.name, environment: environment, traffic: traffic)
        let observer = configuration.observer
        let openConnections = self.openConnections
        let credentials = self.credentials
        poolConfiguration.observer = { event in
            switch event {
            case .opened: openConnections.withLock { $0[labels, default: 0] += 1 }
            case .closed:
                openConnections.withLock { $0[labels, default: 0] -= 1 }
                Self.forgetRetiredSeries(openConnections, credentials)
            default: break
            }
            observer?(environment, event)
        }
        return poolConfiguration
    }
}
