import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A small HTTP/1.1 endpoint for operators: `GET /metrics` (Prometheus text), `/healthz` (alive) and `/readyz`
/// (ready to work). One thread, which never touches the delivery path, waits on every open connection at once: a
/// client that connects and sends nothing (or slowly) holds only its own connection, for at most
/// `requestSeconds`, so a Kubernetes probe behind it is still answered at once.
public final class HealthServer: Sendable {
    public let port: Int
    private let listener: Int32
    private let metrics: @Sendable () -> String
    private let ready: @Sendable () -> Bool
    private let running = Atomic<Bool>(true)

    /// How long a client has to send its request and take its answer, and the most kept at once (the oldest gives
    /// way).
    static let requestSeconds: UInt64 = 2
    static let maximumWaiting = 64
    /// A request's line and headers, at most: a larger one is answered 431 without being read to its end.
    static let maximumRequestBytes = 8192

    public init(
        host: String, port: Int, metrics: @escaping @Sendable () -> String,
        ready: @escaping @Sendable () -> Bool
    ) throws(HealthServerError) {
        let socket: (descriptor: Int32, port: Int)
        do { socket = try ListeningSocket.open(host: host, port: port, backlog: 64, nonBlocking: true) } catch {
            throw HealthServerError(
                error.description, addressInUse: error.addressInUse, hostUnusable: error.hostUnusable)
        }
        listener = socket.descriptor
        self.port = socket.port
        self.metrics = metrics
        self.ready = ready
        let thread = Thread { [self] in serve() }
        thread.name = "health"
        thread.start()
    }

    public func shutdown() {
        running.store(false, ordering: .releasing)
        Glibc.shutdown(listener, Int32(SHUT_RDWR))
    }

    /// A client: its request as it comes, then its answer as it leaves, within `requestSeconds` in all.
    private struct Client {
        var received: [UInt8] = []
        /// The answer, once the request is whole, and how much of it left.
        var answer: [UInt8]?
        var sent = 0
        let deadline: UInt64
    }

    private func serve() {
        var clients: [Int32: Client] = [:]
        // Out of descriptors, the listener stays readable: it is left out of the wait for a while, not spun on.
        var acceptingFrom: UInt64 = 0
        defer {
            for client in clients.keys { close(client) }
            close(listener)
        }
        while running.load(ordering: .acquiring) {
            let accepting = DispatchTime.now().uptimeNanoseconds >= acceptingFrom
            var descriptors = accepting ? [pollfd(fd: listener, events: Int16(POLLIN), revents: 0)] : []
            descriptors += clients.map { client, state in
                pollfd(fd: client, events: Int16(state.answer == nil ? POLLIN : POLLOUT), revents: 0)
            }
            // Wakes at least ten times a second to drop clients past their time (and to notice shutdown).
            guard poll(&descriptors, nfds_t(descriptors.count), 100) >= 0 || errno == EINTR else { return }
            let now = DispatchTime.now().uptimeNanoseconds
            for descriptor in descriptors where descriptor.revents != 0 {
                if descriptor.fd == listener {
                    if !acceptAll(into: &clients, now: now) { acceptingFrom = now + 100_000_000 }
                } else if clients[descriptor.fd] != nil {
                    // A client another turn closed (evicted on accepting) is not touched: its number may be reused.
                    serve(descriptor.fd, &clients)
                }
            }
            for (client, state) in clients where state.deadline <= now {
                clients[client] = nil
                close(client)
            }
        }
    }

    /// Takes every connection waiting to be accepted; false if descriptors ran out (EMFILE), leaving the rest queued.
    private func acceptAll(into clients: inout [Int32: Client], now: UInt64) -> Bool {
        while true {
            let client = accept(listener, nil, nil)
            guard client >= 0 else { return errno != EMFILE && errno != ENFILE }
            _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
            if clients.count >= Self.maximumWaiting,
                let oldest = clients.min(by: { $0.value.deadline < $1.value.deadline })
            {
                clients[oldest.key] = nil
                close(oldest.key)
            }
            clients[client] = Client(deadline: now + Self.requestSeconds * 1_000_000_000)
        }
    }

    /// Reads `client`'s request and, once it is whole, writes its answer as far as the client takes it; closes the
    /// connection when the answer is out, or when the client left before asking.
    private func serve(_ client: Int32, _ clients: inout [Int32: Client]) {
        guard var state = clients[client] else { return }
        if state.answer == nil {
            var buffer = [UInt8](repeating: 0, count: 2048)
            let count = read(client, &buffer, buffer.count)
            if count < 0 && (errno == EAGAIN || errno == EINTR) { return }
            guard count > 0 else {
                clients[client] = nil
                close(client)
                return
            }
            state.received += buffer[..<count]
            if state.received.count > Self.maximumRequestBytes || Self.headersEnd(in: state.received) {
                state.answer = Array(answer(to: state.received).utf8)
            }
        }
        if let answer = state.answer {
            // MSG_NOSIGNAL: a client gone before its answer must not raise SIGPIPE (the process may not ignore it yet).
            let written = answer.withUnsafeBytes {
                send(client, $0.baseAddress! + state.sent, $0.count - state.sent, Int32(MSG_NOSIGNAL))
            }
            if written > 0 { state.sent += written }
            if state.sent == answer.count || (written < 0 && errno != EAGAIN && errno != EINTR) {
                clients[client] = nil
                close(client)
                return
            }
        }
        clients[client] = state
    }

    private static func headersEnd(in bytes: [UInt8]) -> Bool {
        bytes.count >= 4
            && (0...(bytes.count - 4)).contains { index in
                bytes[index] == 13 && bytes[index + 1] == 10 && bytes[index + 2] == 13 && bytes[index + 3] == 10
            }
    }

    /// The answer to a request (its line and headers, as far as they came).
    private func answer(to request: [UInt8]) -> String {
        let (status, body, contentType) = respond(to: request)
        return "HTTP/1.1 \(status)\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.utf8.count)\r\n"
            + "Connection: close\r\n\r\n" + body
    }

    private func respond(to request: [UInt8]) -> (status: String, body: String, contentType: String) {
        guard request.count <= Self.maximumRequestBytes else {
            return ("431 Request Header Fields Too Large", "a request of at most 8192 bytes\n", "text/plain")
        }
        let requestLine = String(decoding: request, as: UTF8.self).split(separator: "\r\n").first ?? ""
        let parts = requestLine.split(separator: " ")
        guard parts.count >= 2, parts[0] == "GET" else { return ("405 Method Not Allowed", "only GET\n", "text/plain") }
        // The path without its query: a probe may add one.
        switch parts[1].split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first ?? "" {
        case "/metrics": return ("200 OK", metrics(), "text/plain; version=0.0.4")
        case "/healthz": return ("200 OK", "ok\n", "text/plain")
        case "/readyz":
            return ready()
                ? ("200 OK", "ready\n", "text/plain") : ("503 Service Unavailable", "not ready\n", "text/plain")
        default: return ("404 Not Found", "try /metrics, /healthz or /readyz\n", "text/plain")
        }
    }
}

public struct HealthServerError: Error, CustomStringConvertible, Sendable {
    public let description: String
    /// The port is someone else's already.
    public let addressInUse: Bool
    /// The host does not resolve, or is no address of this machine: the host setting is at fault, not the port.
    public let hostUnusable: Bool
    init(_ description: String, addressInUse: Bool = false, hostUnusable: Bool = false) {
        self.description = description
        self.addressInUse = addressInUse
        self.hostUnusable = hostUnusable
    }
}

/// The shape of every long-running part of the programs (the worker, the cleanup consumer): it runs until asked to
/// stop, says whether it is ready, and shows its counters. One runner (`apns-worker`'s) starts it, owns the signals
/// and serves its health endpoint.
public protocol Service: Sendable {
    /// Runs until `stop()`; throws only what waiting cannot cure (the process then exits naming it).
    func run() throws
    /// Asks `run()` to finish what is under way and return.
    func stop()
    var isReady: Bool { get }
    /// The Prometheus text of its counters.
    var metricsText: String { get }
    /// Reads again what may change while it runs (SIGHUP): throws why it cannot, keeping what it runs with.
    func reload() throws
}

extension Service {
    public func reload() throws { throw ReloadRefused("this program has nothing to reload") }
}

/// Why a reload changed nothing.
public struct ReloadRefused: Error, Sendable, CustomStringConvertible {
    public var description: String

    public init(_ description: String) { self.description = description }
}
