import Foundation
import Testing

@testable import Telemetry

#if canImport(Glibc)
    import Glibc
#endif

/// The operators' endpoint answers every client on its own: clients that connect and say nothing, or say it in
/// pieces, hold no one else up (a Kubernetes probe behind them has a 2 s timeout).
@Suite struct HealthServerTests {
    func connect(_ port: Int) throws -> Int32 {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        try #require(connected == 0, "connect to 127.0.0.1:\(port)")
        return descriptor
    }

    /// Sends `pieces` in turn, then reads the answer for at most `seconds`: its status line, or "" if none came.
    func exchange(_ port: Int, _ pieces: [String], seconds: Int = 1) throws -> String {
        let client = try connect(port)
        defer { close(client) }
        var timeout = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        for piece in pieces { _ = Array(piece.utf8).withUnsafeBytes { write(client, $0.baseAddress, $0.count) } }
        var response: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while case let count = read(client, &buffer, buffer.count), count > 0 { response += buffer[..<count] }
        return String(decoding: response, as: UTF8.self).components(separatedBy: "\r\n").first ?? ""
    }

    @Test func silentClientsHoldNoOneElseUp() throws {
        let server = try HealthServer(host: "127.0.0.1", port: 0, metrics: { "m 1\n" }, ready: { true })
        defer { server.shutdown() }
        let silent = try (0..<5).map { _ in try connect(server.port) }
        defer { for client in silent { close(client) } }
        // One at a time, each silent client held the endpoint for 2 s: this answer came after 10.
        #expect(try exchange(server.port, ["GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]) == "HTTP/1.1 200 OK")
        #expect(try exchange(server.port, ["GET /readyz?probe=1 HTTP/1.1\r\n\r\n"]) == "HTTP/1.1 200 OK")
    }

    /// Clients that ask for a large /metrics and do not read it hold no one else up either.
    @Test func slowReadersHoldNoOneElseUp() throws {
        let large = String(repeating: "apns_worker_x 1\n", count: 500_000)
        let server = try HealthServer(host: "127.0.0.1", port: 0, metrics: { large }, ready: { true })
        defer { server.shutdown() }
        let slow = try (0..<3).map { _ in try connect(server.port) }
        defer { for client in slow { close(client) } }
        for client in slow {
            _ = Array("GET /metrics HTTP/1.1\r\n\r\n".utf8).withUnsafeBytes { write(client, $0.baseAddress, $0.count) }
        }
        #expect(try exchange(server.port, ["GET /healthz HTTP/1.1\r\n\r\n"]) == "HTTP/1.1 200 OK")
    }

    @Test func aRequestInPiecesIsReadWhole() throws {
        let server = try HealthServer(host: "127.0.0.1", port: 0, metrics: { "m 1\n" }, ready: { false })
        defer { server.shutdown() }
        #expect(
            try exchange(server.port, ["GE", "T /readyz HTTP/1.1\r\n", "Host: x\r\n\r\n"])
                == "HTTP/1.1 503 Service Unavailable")
        let cookie = "Cookie: " + String(repeating: "c", count: 9000) + "\r\n"
        #expect(
            try exchange(server.port, ["GET /healthz HTTP/1.1\r\n" + cookie + "\r\n"])
                == "HTTP/1.1 431 Request Header Fields Too Large")
        #expect(try exchange(server.port, ["POST /metrics HTTP/1.1\r\n\r\n"]) == "HTTP/1.1 405 Method Not Allowed")
    }
}
