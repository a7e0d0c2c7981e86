#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Telemetry
import TLS

/// An HTTP proxy that opens tunnels with CONNECT: `http://[user:password@]host:port`. The password never appears in
/// `description` or in an error.
public struct HTTP2Proxy: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var user: String?
    public var password: String?

    public init(host: String, port: Int, user: String? = nil, password: String? = nil) {
        self.host = host
        self.port = port
        self.user = user
        self.password = password
    }

    /// Why a proxy URL was refused.
    public struct URLError: Error, Sendable, Equatable, CustomStringConvertible {
        public let description: String
    }

    public init(_ text: String) throws(URLError) {
        let parts: ServiceURL
        do { parts = try ServiceURL(text) } catch { throw URLError(description: error.description) }
        guard parts.scheme == "http" else { throw URLError(description: "must start with http:// (CONNECT proxies only)") }
        guard let port = parts.port else { throw URLError(description: "needs a port (http://host:port)") }
        guard parts.path == nil || parts.path == "" else { throw URLError(description: "takes no path") }
        self.init(host: parts.host, port: port, user: parts.user, password: parts.password)
    }

    public var description: String {
        let credentials = user.map { "\($0):***@" } ?? ""
        let shownHost = host.contains(":") ? "[\(host)]" : host
        return "http://\(credentials)\(shownHost):\(port)"
    }

    /// A connected socket through which bytes reach `host:port`: the proxy's answer to CONNECT read, nothing more.
    func openTunnel(to host: String, port: Int, timeout: Double) throws -> Int32 {
        let descriptor: Int32
        do { descriptor = try Socket.connectBlocking(host: self.host, port: self.port, timeout: timeout) } catch {
            throw SocketError(message: "proxy \(self): \(error)")
        }
        do {
            let target = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
            var request = "CONNECT \(target) HTTP/1.1\r\nHost: \(target)\r\n"
            if let user {
                let credentials = Data("\(user):\(password ?? "")".utf8).base64EncodedString()
                request += "Proxy-Authorization: Basic \(credentials)\r\n"
            }
            request += "\r\n"
            try write(Array(request.utf8), to: descriptor)
            let status = try readStatusLine(from: descriptor)
            let words = status.split(separator: " ", maxSplits: 2)
            guard words.count >= 2, words[0].hasPrefix("HTTP/1."), words[1] == "200" else {
                let shown = String(status.prefix(120))
                throw SocketError(message: words.count >= 2 && words[1] == "407"
                    ? "proxy \(self) wants credentials (or refused them): \(shown)"
                    : "proxy \(self) refused the tunnel to \(target): \(shown)")
            }
            return descriptor
        } catch {
            close(descriptor)
            throw error
        }
    }

    private func write(_ bytes: [UInt8], to descriptor: Int32) throws {
        var sent = 0
        while sent < bytes.count {
            let count = bytes[sent...].withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard count > 0 else { throw SocketError("proxy \(self): sending CONNECT") }
            sent += count
        }
    }

    /// The response's status line; the headers are read and dropped, up to the blank line and not one byte more
    /// (TLS follows at once).
    private func readStatusLine(from descriptor: Int32) throws -> String {
        var received: [UInt8] = []
        var byte: UInt8 = 0
        while !(received.count >= 4 && received.suffix(4) == [13, 10, 13, 10]) {
            guard received.count < 16_384 else { throw SocketError(message: "proxy \(self): an answer without an end") }
            guard recv(descriptor, &byte, 1, 0) == 1 else {
                throw SocketError(message: "proxy \(self) closed the connection or timed out before answering CONNECT")
            }
            received.append(byte)
        }
        let text = String(decoding: received, as: UTF8.self)
        return String(text.prefix { $0 != "\r" && $0 != "\n" })
    }
}
