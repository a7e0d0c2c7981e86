#if canImport(Glibc)
    import Glibc
#endif

/// A socket-level error with errno's text.
public struct SocketError: Error, CustomStringConvertible, Sendable {
    public let description: String

    package init(_ what: String, errno code: Int32 = errno) {
        description = "\(what): \(String(cString: strerror(code)))"
    }

    package init(message: String) { description = message }
}

/// Plain socket calls, kept apart from the protocol code.
package enum Socket {
    /// Resolves a host afresh (no cache of ours), as Apple asks before each new connection. Blocks: call it off
    /// any event loop.
    package static func resolve(host: String, port: Int) throws -> [sockaddr_storage] {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_family = AF_UNSPEC
        var result: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &result)
        guard status == 0, let first = result else {
            throw SocketError(message: "cannot resolve \(host): \(String(cString: gai_strerror(status)))")
        }
        defer { freeaddrinfo(first) }
        var addresses: [sockaddr_storage] = []
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let current = entry {
            var storage = sockaddr_storage()
            withUnsafeMutableBytes(of: &storage) { target in
                target.copyMemory(
                    from: UnsafeRawBufferPointer(
                        start: current.pointee.ai_addr,
                        count: Int(current.pointee.ai_addrlen)))
            }
            addresses.append(storage)
            entry = current.pointee.ai_next
        }
        return addresses
    }

    package static func length(of address: sockaddr_storage) -> socklen_t {
        socklen_t(
            address.ss_family == sa_family_t(AF_INET6)
                ? MemoryLayout<sockaddr_in6>.size
                : MemoryLayout<sockaddr_in>.size)
    }

    /// Starts a non-blocking connect; completion shows as POLLOUT.
    package static func startConnect(to address: sockaddr_storage) throws -> Int32 {
        let descriptor = socket(Int32(address.ss_family), Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw SocketError("socket") }
        configure(descriptor)
        var target = address
        let targetLength = length(of: address)
        let result = withUnsafePointer(to: &target) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, targetLength) }
        }
        if result != 0 && errno != EINPROGRESS {
            let error = SocketError("connect", errno: errno)
            close(descriptor)
            throw error
        }
        return descriptor
    }

    /// Non-blocking, close-on-exec, no Nagle delay (HTTP/2 frames are already batched by us).
    package static func configure(_ descriptor: Int32) {
        _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK)
        _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
        var one: Int32 = 1
        setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    /// A blocking socket's sends and receives time out after `timeout` seconds.
    package static func setTimeouts(_ descriptor: Int32, _ timeout: Double) {
        var wait = timeval(tv_sec: Int(timeout), tv_usec: Int(timeout.truncatingRemainder(dividingBy: 1) * 1e6))
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
    }

    /// A blocking socket connected to the first of `host`'s addresses that answers within `timeout` each, whose sends
    /// and receives time out after `timeout` too. Throws naming every address's problem.
    package static func connectBlocking(host: String, port: Int, timeout: Double) throws -> Int32 {
        var problems: [String] = []
        for address in try resolve(host: host, port: port) {
            let descriptor: Int32
            do { descriptor = try startConnect(to: address) } catch {
                problems.append("\(error)")
                continue
            }
            var poller = pollfd(fd: descriptor, events: Int16(POLLOUT), revents: 0)
            var failure: Int32 = 0
            var failureLength = socklen_t(MemoryLayout<Int32>.size)
            if poll(&poller, 1, Int32(timeout * 1000)) == 1,
                getsockopt(descriptor, SOL_SOCKET, SO_ERROR, &failure, &failureLength) == 0, failure == 0
            {
                _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) & ~O_NONBLOCK)
                setTimeouts(descriptor, timeout)
                var one: Int32 = 1
                setsockopt(descriptor, SOL_SOCKET, SO_KEEPALIVE, &one, socklen_t(MemoryLayout<Int32>.size))
                return descriptor
            }
            problems.append(failure == 0 ? "timed out" : String(cString: strerror(failure)))
            close(descriptor)
        }
        throw SocketError(message: "cannot connect to \(host):\(port): " + problems.joined(separator: "; "))
    }
}
