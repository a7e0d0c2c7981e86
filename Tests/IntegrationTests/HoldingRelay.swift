import Foundation
import Synchronization
import Telemetry

#if canImport(Glibc)
    import Glibc
#endif

/// A TCP relay on loopback in front of a server (the broker): a client connected through it can be made to fall
/// silent towards the server (`holdClientBytes`: what it writes from then on is read and kept, never passed on), as a
/// process whose writes stop reaching the broker does, while the server's bytes still reach it. `cut` closes every
/// connection both ways, which the server sees as the client gone. `holdConnections(after:)` makes it a slow server to
/// reach: connections past the first few pass nothing on, either way, until `releaseHeldConnections()`.
final class HoldingRelay: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let target: (host: String, port: Int)
    private let state = Mutex<(held: Bool, descriptors: [Int32], closed: Bool)>((false, [], false))
    /// Connections accepted so far, and how many of the first relay their bytes (nil: all); guarded by `admission`.
    private let admission = NSCondition()
    private var accepted = 0
    private var passingConnections: Int?

    init(to host: String, port targetPort: Int) throws {
        (listener, port) = try ListeningSocket.open(host: "127.0.0.1", port: 0)
        target = (host, targetPort)
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    deinit { cut() }

    /// From now on, what clients write is not passed on.
    func holdClientBytes() { state.withLock { $0.held = true } }

    /// Connections accepted after the first `count` relay nothing, either way, until `releaseHeldConnections()`: their
    /// bytes wait in the sockets, as with a server slow to answer the handshake.
    func holdConnections(after count: Int) {
        admission.withLock { passingConnections = count }
    }

    func releaseHeldConnections() {
        admission.withLock { passingConnections = nil }
        admission.broadcast()
    }

    /// Closes the listener and every relayed connection.
    func cut() {
        let descriptors = state.withLock { state -> [Int32] in
            guard !state.closed else { return [] }
            state.closed = true
            return state.descriptors
        }
        shutdown(listener, Int32(SHUT_RDWR))
        for descriptor in descriptors { shutdown(descriptor, Int32(SHUT_RDWR)) }
    }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            guard client >= 0 else { return }
            guard let server = try? Self.connect(target.host, target.port) else {
                close(client)
                continue
            }
            let open = state.withLock { state -> Bool in
                state.descriptors += [client, server]
                return !state.closed
            }
            guard open else {
                close(client)
                close(server)
                return
            }
            let number = admission.withLock {
                accepted += 1
                return accepted
            }
            Thread.detachNewThread { [self] in
                waitForAdmission(number)
                pump(from: client, to: server, fromClient: true)
            }
            Thread.detachNewThread { [self] in pump(from: server, to: client, fromClient: false) }
        }
    }

    /// Waits while connection `number` (1 for the first accepted) is past the ones allowed through.
    private func waitForAdmission(_ number: Int) {
        admission.withLock {
            while let passing = passingConnections, number > passing { admission.wait() }
        }
    }

    private func pump(from source: Int32, to destination: Int32, fromClient: Bool) {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(source, $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            if fromClient && state.withLock({ $0.held }) { continue }
            var written = 0
            while written < count {
                let sent = buffer.withUnsafeBytes { write(destination, $0.baseAddress! + written, count - written) }
                guard sent > 0 else { break }
                written += sent
            }
        }
        shutdown(destination, Int32(SHUT_RDWR))
        shutdown(source, Int32(SHUT_RDWR))
    }

    private static func connect(_ host: String, _ port: Int) throws -> Int32 {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &result) == 0, let address = result else {
            throw POSIXError(.EHOSTUNREACH)
        }
        defer { freeaddrinfo(address) }
        let descriptor = socket(address.pointee.ai_family, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0, Glibc.connect(descriptor, address.pointee.ai_addr, address.pointee.ai_addrlen) == 0
        else {
            if descriptor >= 0 { close(descriptor) }
            throw POSIXError(.ECONNREFUSED)
        }
        return descriptor
    }
}
