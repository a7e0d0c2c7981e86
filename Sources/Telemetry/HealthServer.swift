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

    /// How long a client has to send its request, and the most kept waiting at once (the oldest gives way).
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

    /// A connection whose request is still coming.
    private struct Waiting {
        var received: [UInt8] = []
        let deadline: UInt64
    }

    private func serve() {
        var waiting: [Int32: Waiting] = [:]
        defer {
            for client in waiting.keys { close(client) }
            close(listener)
        }
        while running.load(ordering: .acquiring) {
            var descriptors = [pollfd(fd: listener, events: Int16(POLLIN), revents: 0)]
            descriptors += waiting.keys.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            // Wakes at least twice a second to drop clients past their time (and to notice shutdown).
            guard poll(&descriptors, nfds_t(descriptors.count), 500) >= 0 || errno == EINTR else { return }
            let now = DispatchTime.now().uptimeNanoseconds
            if descriptors[0].revents != 0 { acceptAll(into: &waiting, now: now) }
            for descriptor in descriptors.dropFirst() where descriptor.revents != 0 {
                if readRequest(from: descriptor.fd, into: &waiting) { finish(descriptor.fd, &waiting) }
            }
            for (client, request) in waiting where request.deadline <= now {
                waiting[client] = nil
                close(client)
            }
        }
    }

    /// Takes every connection waiting to be accepted. Running out of descriptors (EMFILE) leaves the rest queued
    /// for the next turn rather than ending the endpoint.
    private func acceptAll(into waiting: inout [Int32: Waiting], now: UInt64) {
        while true {
            let client = accept(listener, nil, nil)
            guard client >= 0 else { return }
            _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
            if waiting.count >= Self.maximumWaiting,
                let oldest = waiting.min(by: { $0.value.deadline < $1.value.deadline })
            {
                waiting[oldest.key] = nil
                close(oldest.key)
            }
            waiting[client] = Waiting(deadline: now + Self.requestSeconds * 1_000_000_000)
        }
    }

    /// Reads what `client` sent: true once its request is whole (its headers ended), or it stopped sending, or it
    /// sent more than a request may be.
    private func readRequest(from client: Int32, into waiting: inout [Int32: Waiting]) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 2048)
        let count = read(client, &buffer, buffer.count)
        if count < 0 && (errno == EAGAIN || errno == EINTR) { return false }
        guard count > 0 else { return true }
        waiting[client]?.received += buffer[..<count]
        guard let received = waiting[client]?.received else { return true }
        return received.count > Self.maximumRequestBytes || Self.headersEnd(in: received)
    }

    private static func headersEnd(in bytes: [UInt8]) -> Bool {
        bytes.count >= 4
            && (0...(bytes.count - 4)).contains { index in
                bytes[index] == 13 && bytes[index + 1] == 10 && bytes[index + 2] == 13 && bytes[index + 3] == 10
            }
    }

    private func finish(_ client: Int32, _ waiting: inout [Int32: Waiting]) {
        let received = waiting.removeValue(forKey: client)?.received ?? []
        // The answer is written whole: back to blocking, with a second to take it.
        _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) & ~O_NONBLOCK)
        var timeout = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let response = answer(to: received)
        _ = Array(response.utf8).withUnsafeBytes { write(client, $0.baseAddress, $0.count) }
        close(client)
    }

    /// The answer to a request (its line and headers, as far as they came).
    func answer(to request: [UInt8]) -> String {
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
