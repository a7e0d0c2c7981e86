import Foundation
import Synchronization
import TLS
import Telemetry
import Threads

#if canImport(Glibc)
    import Glibc
#endif

/// Persistent HTTP/2 connections to one endpoint, all driven by one `EventLoop` thread.
///
/// Requests are spread over the open connections by load, each connection within the peer's
/// SETTINGS_MAX_CONCURRENT_STREAMS (nghttp2 holds back what exceeds it). The pool keeps `connectionCount` connections
/// open and grows with demand: when every stream of its open connections is busy and requests wait, it opens more, up
/// to `maximumConnectionCount`; new requests fill the first `connectionCount` connections before the extra ones, so
/// that an extra connection falls idle when demand falls, and closes after `idleConnectionLifetime`. A request whose
/// stream was refused,
/// never sent, or lost with its connection is sent again on another connection, up to `maximumAttempts` sends.
/// Completions run on the loop thread: keep them short, hand real work to another thread in batches.
public final class HTTP2Client: @unchecked Sendable {
    // Invariant: everything below `loop` is touched only on the loop thread.
    public typealias Completion = @Sendable (Result<HTTP2Response, HTTP2StreamError>) -> Void

    public typealias BatchCompletion = @Sendable (Int, Result<HTTP2Response, HTTP2StreamError>) -> Void

    public let configuration: Configuration
    /// The :authority value requests to this endpoint carry.
    public let authority: String
    public let loop: EventLoop
    private let ownsLoop: Bool
    private let tlsContext: TLSContext
    private let logger: Logger
    /// `configuration.keptResponseHeaders` as bytes, compared with each field's name as it arrives.
    private let keptHeaders: [[UInt8]]?
    private let keptSuccessHeaders: [[UInt8]]?

    private var connections: [HTTP2Connection] = []
    private var connectionsStarting = 0
    /// Client streams not submitted yet, oldest first.
    private var waiting: [HTTP2RequestStream] = []
    private var consecutiveFailedConnects = 0
    private var reconnectTimer: UInt64?
    private var nextConnectionID = 1
    private var isShutDown = false
    private var sweepTimer: UInt64?
    private var lastConnectError: String?
    /// A drain of the waiting requests is queued on the loop: answers arriving together ask for one drain.
    private var waitingDrainQueued = false
    /// The stream limit the peer last announced on a connection of this pool: what a connection whose peer's SETTINGS
    /// have not arrived yet is taken to allow (100 before any, the least RFC 9113 recommends a server allow).
    private var announcedStreamLimit = HTTP2Client.streamLimitBeforeSettings
    public static let streamLimitBeforeSettings = 100
    /// Connections closing because they fell idle above `connectionCount`: their close is no failure.
    private var retiring: Set<Int> = []
    /// Streams in use over the pool's open connections, sampled by the sweep (every second) for metrics.
    private let streamsInUseSample = Atomic<Int>(0)
    /// `streamCapacity`, kept by the loop thread as the peer's stream limit changes.
    private let streamCapacitySample: Atomic<Int>

    public init(configuration: Configuration, loop: EventLoop? = nil, logger: Logger) throws {
        self.configuration = configuration
        self.authority = configuration.port == 443 ? configuration.host : "\(configuration.host):\(configuration.port)"
        self.tlsContext = try TLSContext.client(configuration.tls)
        self.logger = logger
        self.keptHeaders = configuration.keptResponseHeaders.map { $0.map { Array($0.utf8) } }
        keptSuccessHeaders = configuration.keptSuccessResponseHeaders.map { $0.map { Array($0.utf8) } }
        self.ownsLoop = loop == nil
        self.streamCapacitySample = Atomic(configuration.maximumConnectionCount * Self.streamLimitBeforeSettings)
        self.loop = loop ?? EventLoop(name: "http2-\(configuration.host)")
        self.loop.execute { [self] in
            scheduleSweep()
            openMissingConnections()
        }
    }

    /// Streams in use over the pool's connections (each counted up to its peer's limit), as of the last second.
    public var streamsInUse: Int { streamsInUseSample.load(ordering: .relaxed) }

    /// Requests the pool can carry at once: each connection at its own stream limit (APNs changes a connection's as
    /// it goes, down to one stream after a rejected push and back after a success), and the connections it may still
    /// open at the highest limit one has. What is sent beyond it waits, here or in nghttp2, for a stream to free: a
    /// sender that keeps its own queue hands over no more than this.
    public var streamCapacity: Int { streamCapacitySample.load(ordering: .relaxed) }

    /// A peer that sets no limit allows 2^32 - 1 streams: counted as a million, which no sender's window reaches.
    private static func countable(_ streamLimit: Int) -> Int { min(streamLimit, 1_000_000) }

    /// Loop thread: `streamCapacity` again, after a connection's limit changed or a connection left.
    private func refreshStreamCapacity() {
        var counted = 0
        var capacity = 0
        var highest = 0
        for connection in connections where connection.isUsable {
            let limit = Self.countable(streamLimit(of: connection))
            counted += 1
            capacity += limit
            highest = max(highest, limit)
        }
        let unopened = max(0, configuration.maximumConnectionCount - counted)
        capacity += unopened * (counted == 0 ? Self.countable(announcedStreamLimit) : highest)
        streamCapacitySample.store(capacity, ordering: .relaxed)
    }

    /// Sends one request; `completion` runs on the loop thread.
    public func send(_ request: HTTP2Request, completion: @escaping Completion) {
        send([request]) { _, result in completion(result) }
    }

    /// Sends a batch; `completion` runs once per request, with its index, on the loop thread.
    public func send(_ requests: [HTTP2Request], completion: @escaping BatchCompletion) {
        loop.execute { [self] in
            let now = EventLoop.now()
            let deadline = now + UInt64(configuration.requestTimeout * 1e9)
            // The wall clock, read once for the batch, and only if a request has a send-by time.
            var unixNow: Double?
            var touched: [HTTP2Connection] = []
            for index in requests.indices {
                var sendBy = UInt64.max
                if requests[index].sendBy != .infinity {
                    let unix = unixNow ?? Date().timeIntervalSince1970
                    unixNow = unix
                    sendBy = Self.instant(requests[index].sendBy, unixNow: unix, now: now)
                }
                let stream = HTTP2RequestStream(
                    batch: requests, index: index, attempt: 1, deadline: deadline, sendBy: sendBy,
                    completion: completion)
                if let connection = dispatch(stream), !touched.contains(where: { $0 === connection }) {
                    touched.append(connection)
                }
            }
            for connection in touched { connection.flushSoon() }
        }
    }

    /// Closes every connection and fails what is queued; waits for the loop if it owns it.
    public func shutdown() {
        loop.execute { [self] in
            isShutDown = true
            if let reconnectTimer { loop.cancelTimer(reconnectTimer) }
            if let sweepTimer { loop.cancelTimer(sweepTimer) }
            for connection in connections { connection.close(reason: "client shut down") }
            failWaiting(.notSent("client shut down"))
        }
        if ownsLoop { loop.shutdown() }
    }

    /// Takes no new requests and lets every connection finish the streams it has, then close (a GOAWAY of its own):
    /// for a pool being replaced, its credential having changed. Requests still waiting for a connection fail with
    /// `notSent`, which is safe to send on another pool.
    public func drain() {
        loop.execute { [self] in
            guard !isShutDown else { return }
            isShutDown = true
            if let reconnectTimer { loop.cancelTimer(reconnectTimer) }
            failWaiting(.notSent("connection pool replaced"))
            for connection in connections {
                if connection.state == .open {
                    connection.goAway(code: 0, debugData: "credential replaced", lastStreamID: 0)
                } else {
                    connection.close(reason: "connection pool replaced")
                }
            }
        }
    }

    // MARK: loop thread

    /// Puts the request on the connection `nextConnection` picks; when every stream is busy and the pool is growing,
    /// or when no connection is open, queues it until a connection opens or a stream frees.
    private func dispatch(_ stream: HTTP2RequestStream) -> HTTP2Connection? {
        guard !isShutDown else {
            stream.complete(.failure(.notSent("client shut down")))
            return nil
        }
        if stream.sendBy != .max && stream.sendBy <= EventLoop.now() {
            stream.complete(.failure(.sendByPassed))
            return nil
        }
        if let next = nextConnection(), next.hasFreeStream || !isGrowing(),
            connections[next.index].submitRequest(stream)
        {
            return connections[next.index]
        }
        waiting.append(stream)
        openMissingConnections()
        return nil
    }

    /// The least-loaded connection among the first `connectionCount` while one has a free stream, then among the
    /// extra ones with a free stream, then among all (nghttp2 holds back what exceeds a peer's limit). Filling the
    /// first connections first lets the extra ones fall idle, and close, when demand falls.
    /// By index in `connections`: a connection held in a variable is a counted reference, taken and given back for
    /// each connection looked at, on every request.
    private func nextConnection() -> (index: Int, hasFreeStream: Bool)? {
        var best: Int?
        var bestRank = Double.infinity
        var usableSeen = 0
        for index in connections.indices where connections[index].isUsable {
            usableSeen += 1
            guard connections[index].acceptsRequests else { continue }
            let load = Double(connections[index].openStreamCount) / Double(max(1, streamLimit(of: connections[index])))
            // A first connection with a free stream ranks in [0, 1), an extra one in [1, 2), a full one from 2.
            let rank = load >= 1 ? 2 + load : usableSeen <= configuration.connectionCount ? load : 1 + load
            if rank < bestRank {
                best = index
                bestRank = rank
            }
        }
        return best.map { ($0, bestRank < 2) }
    }

    /// The peer's stream limit on `connection`; before its SETTINGS arrive, the limit announced last on the pool.
    private func streamLimit(of connection: HTTP2Connection) -> Int {
        connection.remoteSettingsReceived ? connection.remoteMaxConcurrentStreams : announcedStreamLimit
    }

    /// Whether a request that finds every stream busy waits for a connection on its way (or about to start) rather
    /// than queueing behind busy streams: while one is opening, whatever the pool's size (a pool that may not grow
    /// still opens its `connectionCount` together, and the first to open must not take what the others are for), or
    /// in a pool allowed to grow, not backing off from a failed connect.
    private func isGrowing() -> Bool {
        guard !isShutDown else { return false }
        let (usable, opening, _) = poolCensus()
        return opening > 0
            || (configuration.maximumConnectionCount > configuration.connectionCount && reconnectTimer == nil
                && usable < configuration.maximumConnectionCount)
    }

    /// Connections open or on their way (not going away), those of them not open yet, and the largest stream limit
    /// of the open ones (0 when none is open).
    private func poolCensus() -> (usable: Int, opening: Int, streamsPerConnection: Int) {
        var usable = connectionsStarting
        var opening = connectionsStarting
        var streamsPerConnection = 0
        for connection in connections where connection.isUsable {
            usable += 1
            if connection.state == .open {
                streamsPerConnection = max(streamsPerConnection, streamLimit(of: connection))
            } else {
                opening += 1
            }
        }
        return (usable, opening, streamsPerConnection)
    }

    private func finished(_ stream: HTTP2RequestStream, _ result: Result<HTTP2Response, HTTP2StreamError>) {
        // Only an answer proves the endpoint healthy; a connection that opens and then drops does not.
        if case .success = result { consecutiveFailedConnects = 0 }
        if case .failure(let error) = result, !isShutDown, EventLoop.now() < stream.deadline {
            // A refused or unsent request was not processed: sending it again is always safe, so only the deadline
            // bounds it. A lost connection may have delivered it: that counts as an attempt.
            let attempt: Int?
            switch error {
            case .refused, .notSent: attempt = stream.attempt
            case .connectionLost: attempt = stream.attempt < configuration.maximumAttempts ? stream.attempt + 1 : nil
            case .reset, .timedOut, .sendByPassed: attempt = nil
            }
            if let attempt {
                logger.debug(
                    "resending a request", ["http2.reason": error.description, "http2.attempt": String(attempt)])
                // Resent after the current callback returns, never from inside nghttp2's own callback.
                waiting.append(stream.resent(attempt: attempt))
                drainWaitingSoon()
                return
            }
        }
        stream.complete(result)
        // A stream freed: what waits for a new connection may take it now.
        if !waiting.isEmpty { drainWaitingSoon() }
    }

    /// Drains the waiting requests after the current callback returns (never from inside nghttp2's own callback),
    /// once however many ask before it runs.
    private func drainWaitingSoon() {
        guard !waitingDrainQueued else { return }
        waitingDrainQueued = true
        loop.execute { [self] in
            waitingDrainQueued = false
            drainWaiting()
        }
    }

    private func drainWaiting() {
        guard !waiting.isEmpty, connections.contains(where: { $0.acceptsRequests }) else {
            openMissingConnections()
            return
        }
        let queued = waiting
        waiting.removeAll(keepingCapacity: true)
        var touched: [HTTP2Connection] = []
        for stream in queued {
            if let connection = dispatch(stream), !touched.contains(where: { $0 === connection }) {
                touched.append(connection)
            }
        }
        for connection in touched { connection.flushSoon() }
    }

    private func failWaiting(_ error: HTTP2StreamError) {
        let queued = waiting
        waiting.removeAll()
        for stream in queued { stream.complete(.failure(error)) }
    }

    /// Opens connections up to `connectionCount`, and beyond it, up to `maximumConnectionCount`, as many as the
    /// waiting requests fill (once a connection is open, its stream limit says how many a connection takes).
    private func openMissingConnections() {
        guard !isShutDown, reconnectTimer == nil else { return }
        // A connection that received GOAWAY finishes its streams but takes no more: it no longer counts.
        let (usable, opening, streamsPerConnection) = poolCensus()
        var wanted = configuration.connectionCount
        if streamsPerConnection > 0, !waiting.isEmpty, configuration.maximumConnectionCount > wanted {
            let forWaiting = (waiting.count + streamsPerConnection - 1) / streamsPerConnection
            wanted = min(configuration.maximumConnectionCount, max(wanted, usable - opening + forWaiting))
        }
        for _ in usable..<max(usable, wanted) { startConnection() }
    }

    private func startConnection() {
        connectionsStarting += 1
        let host = configuration.host
        let port = configuration.port
        let resolve = configuration.resolve
        if let proxy = configuration.proxy {
            let timeout = configuration.connectTimeout
            // Connecting to the proxy and its answer to CONNECT block: a short-lived thread of their own.
            Thread { [self] in
                let tunnel = Result { try proxy.openTunnel(to: host, port: port, timeout: timeout) }
                loop.execute { [self] in
                    connectionsStarting -= 1
                    switch tunnel {
                    case .success(let descriptor): connect(tunnel: descriptor)
                    case .failure(let error): connectFailed("\(error)")
                    }
                }
            }.start()
            return
        }
        // DNS blocks, so it runs on a short-lived thread of its own, afresh for every new connection.
        let resolver = Thread { [self] in
            let addresses = Result { try resolve(host, port) }
            loop.execute { [self] in
                connectionsStarting -= 1
                switch addresses {
                case .success(let found) where !found.isEmpty: connect(found[...], problems: [])
                case .success: connectFailed("\(host) has no address")
                case .failure(let error): connectFailed("\(error)")
                }
            }
        }
        resolver.start()
    }

    /// Connects to the first of `addresses`; if that fails before the connection opens (refused, unreachable, timed
    /// out, a failed handshake), to the next (IPv6 and IPv4 addresses alike), and backs off only when none is left.
    private func connect(_ addresses: ArraySlice<sockaddr_storage>, problems: [String]) {
        guard !isShutDown else { return }
        guard let address = addresses.first else {
            connectFailed(problems.joined(separator: "; "))
            return
        }
        let fallback = addresses.dropFirst()
        do {
            let descriptor = try Socket.startConnect(to: address)
            let tls: TLSStream
            do {
                tls = try TLSStream(context: tlsContext, fileDescriptor: descriptor, serverName: configuration.host)
            } catch {
                close(descriptor)
                throw error
            }
            let connection = HTTP2Connection(
                id: nextConnectionID, loop: loop, fileDescriptor: descriptor, tls: tls,
                role: .client, connecting: true, keptHeaders: keptHeaders, keptSuccessHeaders: keptSuccessHeaders)
            nextConnectionID += 1
            adopt(connection) { [self] reason in connect(fallback, problems: problems + [reason]) }
        } catch {
            connect(fallback, problems: problems + ["\(error)"])
        }
    }

    /// TLS and HTTP/2 inside a proxy's tunnel (already connected, blocking until now).
    private func connect(tunnel descriptor: Int32) {
        guard !isShutDown else {
            close(descriptor)
            return
        }
        Socket.configure(descriptor)
        do {
            let tls = try TLSStream(context: tlsContext, fileDescriptor: descriptor, serverName: configuration.host)
            let connection = HTTP2Connection(
                id: nextConnectionID, loop: loop, fileDescriptor: descriptor, tls: tls,
                role: .client, connecting: true, keptHeaders: keptHeaders, keptSuccessHeaders: keptSuccessHeaders)
            nextConnectionID += 1
            adopt(connection) { [self] reason in connectFailed(reason) }
        } catch {
            close(descriptor)
            connectFailed("\(error)")
        }
    }

    /// `tryNextAddress`: what to do if the connection closes before it opens, instead of backing off.
    private func adopt(_ connection: HTTP2Connection, tryNextAddress: @escaping (String) -> Void) {
        connections.append(connection)
        refreshStreamCapacity()
        loop.register(connection)
        var opened = false
        let connectionID = connection.id
        let connectTimer = loop.schedule(after: configuration.connectTimeout) { [self] in
            connections.first { $0.id == connectionID }?.close(reason: "connect and TLS handshake timed out")
        }
        // The handlers are given their connection rather than capturing it, and capture the client strongly: a weak
        // reference would put either object's reference count in a side table, where every retain is slow. The
        // connection drops them when it closes, and the client drops the connection.
        connection.onOpen = { [self] connection in
            opened = true
            loop.cancelTimer(connectTimer)
            configuration.observer?(.opened(connection: connection.id))
            logger.info(
                "HTTP/2 connection open", ["http2.connection": String(connection.id), "http2.endpoint": authority])
            drainWaiting()
        }
        connection.onRemoteSettings = { [self] connection, maximumStreams in
            logger.debug(
                "peer settings",
                [
                    "http2.connection": String(connection.id),
                    "http2.max_concurrent_streams": String(maximumStreams)
                ])
            announcedStreamLimit = maximumStreams
            refreshStreamCapacity()
            // A raised limit makes room for what waits.
            loop.execute { [self] in drainWaiting() }
        }
        connection.onResponse = { [self] stream, result in finished(stream, result) }
        connection.onPingAcknowledged = { [self] connection in
            configuration.observer?(.pingAcknowledged(connection: connection.id))
        }
        connection.onGoAway = { [self] connection, lastStreamID, code, debugData in
            goAwayReceived(on: connection, lastStreamID: lastStreamID, code: code, debugData: debugData)
        }
        connection.onClose = { [self] connection, reason in
            loop.cancelTimer(connectTimer)
            closed(connection, reason: reason, opened: opened, tryNextAddress: tryNextAddress)
        }
    }

    private func goAwayReceived(on connection: HTTP2Connection, lastStreamID: Int32, code: UInt32, debugData: String) {
        configuration.observer?(
            .goAway(connection: connection.id, lastStreamID: lastStreamID, errorCode: code, debugData: debugData))
        logger.warning(
            "GOAWAY received",
            [
                "http2.connection": String(connection.id),
                "http2.last_stream_id": String(lastStreamID),
                "http2.error_code": String(code),
                "http2.goaway_reason": Redact.outsideText(debugData, limit: 200)
            ])
        // Replace the connection now (the old one finishes its streams below last-stream-id and closes), unless it
        // never served a response: then the close path backs off, so a hostile endpoint cannot make us loop.
        if connection.responsesReceived > 0 { loop.execute { [self] in openMissingConnections() } }
    }

    /// A connection left the pool: one that served is replaced, one that never opened tries the next address, one
    /// that opened and closed before any response backs off as a failed connect.
    private func closed(
        _ connection: HTTP2Connection, reason: String, opened: Bool, tryNextAddress: (String) -> Void
    ) {
        connections.removeAll { $0 === connection }
        refreshStreamCapacity()
        if opened { configuration.observer?(.closed(connection: connection.id, reason: reason)) }
        if retiring.remove(connection.id) != nil {
            logger.info(
                "idle HTTP/2 connection closed",
                ["http2.connection": String(connection.id), "http2.endpoint": authority])
        } else if opened && connection.responsesReceived > 0 {
            logger.info(
                "HTTP/2 connection closed", ["http2.connection": String(connection.id), "http2.reason": reason])
            loop.execute { [self] in openMissingConnections() }
        } else if !opened {
            tryNextAddress(reason)
        } else {
            connectFailed("closed before any response: \(reason)")
        }
    }

    private func connectFailed(_ reason: String) {
        guard !isShutDown else { return }
        consecutiveFailedConnects += 1
        lastConnectError = reason
        configuration.observer?(.connectFailed(reason: reason))
        let delay = Backoff.equalJitter(
            afterFailures: consecutiveFailedConnects, base: configuration.reconnectBaseDelay,
            cap: configuration.reconnectMaximumDelay)
        logger.error(
            "cannot connect to APNs endpoint",
            [
                "http2.endpoint": authority, "http2.reason": reason,
                "http2.retry_in_s": String(format: "%.2f", delay)
            ])
        guard reconnectTimer == nil, !isShutDown else { return }
        reconnectTimer = loop.schedule(after: delay) { [self] in
            reconnectTimer = nil
            openMissingConnections()
        }
        // Requests that waited for this connection go on the busy ones instead.
        if !waiting.isEmpty { drainWaitingSoon() }
    }

    /// Connections above `connectionCount` that carried nothing (no stream, no frame) for `idleConnectionLifetime` say
    /// GOAWAY and close.
    private func closeIdleExtraConnections(now: UInt64) {
        let lifetime = UInt64(configuration.idleConnectionLifetime * 1e9)
        var usableSeen = 0
        for connection in connections where connection.isUsable {
            usableSeen += 1
            guard usableSeen > configuration.connectionCount, connection.state == .open,
                connection.openStreamCount == 0, connection.lastFrameReceivedAt + lifetime <= now
            else { continue }
            retiring.insert(connection.id)
            connection.goAway(code: 0, debugData: "idle", lastStreamID: 0)
        }
    }

    /// `seconds` before `now` (`EventLoop.now`), or the clock's start if that is earlier: the monotonic clock counts
    /// from the host's boot, so on a host up for less than a request timeout the plain subtraction went below zero
    /// and stopped the process.
    static func instant(_ seconds: Double, before now: UInt64) -> UInt64 {
        let span = UInt64(seconds * 1e9)
        return now > span ? now - span : 0
    }

    /// UNIX time `unixSeconds` on the `EventLoop.now` clock, which reads `now` as the wall clock reads `unixNow`: 0
    /// for a time past, at most 30 years ahead (a deadline far ahead would overflow the count of nanoseconds).
    static func instant(_ unixSeconds: Double, unixNow: Double, now: UInt64) -> UInt64 {
        let remaining = unixSeconds - unixNow
        guard remaining > 0 else { return 0 }
        return now + UInt64(min(remaining, 1e9) * 1e9)
    }

    /// Requests past their deadline, queued or in flight, end with `timedOut`; idle connections get a PING, and one
    /// whose PING goes unanswered is replaced. Runs every second, or faster for short timeouts in tests.
    private func scheduleSweep() {
        let period = min(
            1, configuration.requestTimeout / 4, configuration.pingInterval / 2, configuration.pingTimeout / 2)
        sweepTimer = loop.schedule(after: period) { [self] in
            let now = EventLoop.now()
            let isExpired = { (stream: HTTP2RequestStream) in stream.deadline <= now || stream.sendBy <= now }
            let expired = waiting.filter(isExpired)
            if !expired.isEmpty {
                waiting.removeAll(where: isExpired)
                let reason = lastConnectError.map { HTTP2StreamError.notSent("no connection: \($0)") } ?? .timedOut
                for stream in expired { stream.complete(.failure(stream.sendBy <= now ? .sendByPassed : reason)) }
            }
            closeIdleExtraConnections(now: now)
            let requestCutoff = Self.instant(configuration.requestTimeout, before: now)
            for connection in connections where connection.state == .open {
                // An idle connection sends nothing, so it is checked here too: what waits there is answered.
                connection.dropUnsentRequests(pastSendByAt: now)
                connection.expireStreams(startedBefore: requestCutoff)
                if let sent = connection.pingSentAt, Double(now - sent) / 1e9 > configuration.pingTimeout {
                    connection.close(reason: "PING unanswered for \(configuration.pingTimeout) s")
                } else {
                    let silence = Double(now - connection.lastFrameReceivedAt) / 1e9
                    if silence > configuration.pingInterval
                        || (silence > configuration.busySilence && connection.openStreamCount > 0)
                    {
                        connection.ping()
                    }
                }
            }
            streamsInUseSample.store(
                connections.reduce(0) { $0 + min($1.openStreamCount, streamLimit(of: $1)) },
                ordering: .relaxed)
            // A drained pool keeps timing its streams out until its last connection has closed.
            if !(isShutDown && connections.isEmpty) { scheduleSweep() }
        }
    }
}
