import Foundation
import ServiceURLs
import TLS
import Telemetry

#if canImport(Glibc)
    import Glibc
#endif

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
        guard parts.scheme == "http" else {
            throw URLError(description: "must start with http:// (CONNECT proxies only)")
        }
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
            switch ConnectAnswer(try readAnswer(from: descriptor, timeout: timeout)) {
            case .tunnel:
                return descriptor
            case .wantsCredentials(let shown):
                throw SocketError(message: "proxy \(self) wants credentials (or refused them): \(shown)")
            case .refused(let shown):
                throw SocketError(message: "proxy \(self) refused the tunnel to \(target): \(shown)")
            }
        } catch {
            close(descriptor)
            throw error
        }
    }

    private func write(_ bytes: [UInt8], to descriptor: Int32) throws {
        var sent = 0
        while sent < bytes.count {
            let count = bytes[sent...].withUnsafeBytes {
                Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            guard count > 0 else { throw SocketError("proxy \(self): sending CONNECT") }
            sent += count
        }
    }

    /// The response up to the blank line that ends its headers, and not one byte more (TLS follows at once), within
    /// `timeout` in all: the socket's timeout bounds each byte, not a proxy that drips them.
    private func readAnswer(from descriptor: Int32, timeout: Double) throws -> [UInt8] {
        let deadline = DispatchTime.now() + timeout
        var received: [UInt8] = []
        var byte: UInt8 = 0
        while !ConnectAnswer.isComplete(received) {
            guard received.count < ConnectAnswer.maximumSize else {
                throw SocketError(message: "proxy \(self): an answer without an end")
            }
            guard DispatchTime.now() < deadline else {
                throw SocketError(message: "proxy \(self) did not finish answering CONNECT within \(timeout) s")
            }
            guard recv(descriptor, &byte, 1, 0) == 1 else {
                throw SocketError(message: "proxy \(self) closed the connection or timed out before answering CONNECT")
            }
            received.append(byte)
        }
        return received
    }
}

/// What a proxy's answer to CONNECT says: only `HTTP/1.x 200` opens the tunnel. The status line is shown (at most
/// 120 characters, control characters replaced) in the error of an answer that does not.
package enum ConnectAnswer: Equatable {
    case tunnel
    case wantsCredentials(String)
    case refused(String)

    /// Headers longer than this are not an answer a proxy gives.
    package static let maximumSize = 16_384

    /// Whether `bytes` end with the blank line that ends the headers.
    package static func isComplete(_ bytes: [UInt8]) -> Bool {
        bytes.count >= 4 && bytes[bytes.count - 4] == 13 && bytes[bytes.count - 3] == 10 && bytes[bytes.count - 2] == 13
            && bytes[bytes.count - 1] == 10
    }

    package init(_ answer: [UInt8]) {
        let line = answer.prefix { $0 != 13 && $0 != 10 }
        let words = line.split(separator: UInt8(ascii: " "), maxSplits: 2, omittingEmptySubsequences: false)
        let status = words.count >= 2 ? Array(words[1]) : []
        if words.count >= 2, words[0].starts(with: Array("HTTP/1.".utf8)), status == Array("200".utf8) {
            self = .tunnel
            return
        }
        let shown = Redact.printable(String(decoding: line.prefix(120), as: UTF8.self))
        self = status == Array("407".utf8) ? .wantsCredentials(shown) : .refused(shown)
    }
}
