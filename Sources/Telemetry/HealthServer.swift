import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A small HTTP/1.1 endpoint for operators: `GET /metrics` (Prometheus text), `/healthz` (alive) and `/readyz`
/// (ready to work). One thread, one short request per connection; it never touches the delivery path.
public final class HealthServer: Sendable {
    public let port: Int
    private let listener: Int32
    private let metrics: @Sendable () -> String
    private let ready: @Sendable () -> Bool
    private let running = Atomic<Bool>(true)

    public init(
        host: String, port: Int, metrics: @escaping @Sendable () -> String,
        ready: @escaping @Sendable () -> Bool
    ) throws(HealthServerError) {
        let socket: (descriptor: Int32, port: Int)
        do { socket = try ListeningSocket.open(host: host, port: port, backlog: 16) } catch {
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

    private func serve() {
        while running.load(ordering: .acquiring) {
            let client = accept(listener, nil, nil)
            guard client >= 0 else {
                if errno == EINTR { continue }
                break
            }
            // A slow or silent client must not hold the endpoint: two seconds to send its request line.
            var timeout = timeval(tv_sec: 2, tv_usec: 0)
            setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            respond(to: client)
            close(client)
        }
        close(listener)
    }

    private func respond(to client: Int32) {
        var buffer = [UInt8](repeating: 0, count: 2048)
        let count = read(client, &buffer, buffer.count)
        guard count > 0 else { return }
        let requestLine = String(decoding: buffer[..<count], as: UTF8.self).split(separator: "\r\n").first ?? ""
        let parts = requestLine.split(separator: " ")
        let (status, body): (String, String)
        if parts.count < 2 || parts[0] != "GET" {
            (status, body) = ("405 Method Not Allowed", "only GET\n")
        } else {
            switch parts[1] {
            case "/metrics": (status, body) = ("200 OK", metrics())
            case "/healthz": (status, body) = ("200 OK", "ok\n")
            case "/readyz":
                (status, body) = ready() ? ("200 OK", "ready\n") : ("503 Service Unavailable", "not ready\n")
            default: (status, body) = ("404 Not Found", "try /metrics, /healthz or /readyz\n")
            }
        }
        let contentType = parts.count > 1 && parts[1] == "/metrics" ? "text/plain; version=0.0.4" : "text/plain"
        let response =
            "HTTP/1.1 \(status)\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.utf8.count)\r\n"
            + "Connection: close\r\n\r\n" + body
        _ = Array(response.utf8).withUnsafeBytes { write(client, $0.baseAddress, $0.count) }
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
