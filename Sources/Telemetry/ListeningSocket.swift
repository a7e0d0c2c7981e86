#if canImport(Glibc)
    import Glibc
#endif

/// A listening TCP socket: the one way the programs open one (the health endpoint, the HTTP/2 server of apns-sim,
/// the tests' stand-ins).
public enum ListeningSocket {
    public struct Failure: Error, Sendable, CustomStringConvertible {
        public let description: String
        /// Someone else listens there already (EADDRINUSE).
        public var addressInUse = false
        /// The host is at fault: it does not resolve, or is no address of this machine (EADDRNOTAVAIL).
        public var hostUnusable = false
    }

    /// Listens on host:port (port 0: the kernel picks a free one); returns the socket and the port it got.
    /// `nonBlocking` for a socket an event loop polls.
    public static func open(
        host: String, port: Int, backlog: Int32 = 1024,
        nonBlocking: Bool = false
    ) throws(Failure) -> (descriptor: Int32, port: Int) {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_family = AF_UNSPEC
        hints.ai_flags = AI_PASSIVE
        var result: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &result)
        guard status == 0, let address = result else {
            throw Failure(
                description: "cannot resolve \(host): \(String(cString: gai_strerror(status)))", hostUnusable: true)
        }
        defer { freeaddrinfo(address) }
        let descriptor = socket(address.pointee.ai_family, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else {
            throw Failure(description: "socket: \(String(cString: strerror(errno)))")
        }
        var one: Int32 = 1
        setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        guard bind(descriptor, address.pointee.ai_addr, address.pointee.ai_addrlen) == 0,
            listen(descriptor, backlog) == 0
        else {
            let code = errno
            close(descriptor)
            throw Failure(
                description: "cannot listen on \(host):\(port): \(String(cString: strerror(code)))",
                addressInUse: code == EADDRINUSE, hostUnusable: code == EADDRNOTAVAIL)
        }
        _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
        if nonBlocking { _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK) }
        var actual = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        // sin_port and sin6_port sit at the same offset, in network byte order.
        let actualPort = withUnsafeBytes(of: &actual) { UInt16(bigEndian: $0.load(fromByteOffset: 2, as: UInt16.self)) }
        return (descriptor, Int(actualPort))
    }
}
