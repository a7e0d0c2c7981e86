import TLS

#if canImport(Glibc)
    import Glibc
#endif

/// How a `rediss://` connection checks the server and proves who it is (REDIS_CA_FILE, REDIS_CERT_FILE,
/// REDIS_CERT_KEY_FILE). The server's name is checked against its certificate (an IP address, against its IP SANs).
public struct RedisTLS: Sendable, Equatable {
    /// A private CA bundle (PEM), added to the system trust store.
    public var caFile: String?
    /// A client certificate (PEM) and its key, for servers that require one (`tls-auth-clients yes`).
    public var certificateFile: String?
    public var keyFile: String?

    public init(caFile: String? = nil, certificateFile: String? = nil, keyFile: String? = nil) {
        self.caFile = caFile
        self.certificateFile = certificateFile
        self.keyFile = keyFile
    }
}

/// One Redis connection's bytes: a blocking socket of its own, plain or with an OpenSSL session (`rediss://`),
/// commands written in one buffer (`RESP`) and replies read in place (`RedisReplyReader`). The socket's send and
/// receive timeouts bound every call.
final class RedisChannel {
    private let descriptor: Int32
    /// nil: plain TCP.
    private let stream: TLSStream?
    private let reader = RedisReplyReader()
    private var output: [UInt8] = []
    private let name: String
    /// Why the connection was lost, once it was. A reply that comes after its command timed out would be read as the
    /// next command's: once lost, the connection writes and reads nothing more.
    private var lostBecause: RedisError?

    init(host: String, port: Int, tls: RedisTLS?, timeout: Double, name: String) throws(RedisError) {
        self.name = name
        guard let tls else {
            descriptor = try Self.connect(host: host, port: port, timeout: timeout, name: name)
            stream = nil
            return
        }
        let context: TLSContext
        do {
            context = try TLSContext.client(
                TLSClientConfiguration(
                    caFile: tls.caFile, certificateFile: tls.certificateFile,
                    privateKeyFile: tls.keyFile ?? tls.certificateFile,
                    applicationProtocols: []))
        } catch {
            let part: RedisError.Part =
                switch (error as? TLSError)?.file {
                case .certificate?: .clientCertificate
                case .privateKey?: .clientKey
                case .trustedCertificates?, nil: .tls
                }
            throw RedisError(kind: .refused, "\(name): \(error)", part: part)
        }
        descriptor = try Self.connect(host: host, port: port, timeout: timeout, name: name)
        let stream: TLSStream
        do {
            stream = try TLSStream(context: context, fileDescriptor: descriptor, serverName: host)
        } catch {
            close(descriptor)
            throw RedisError(kind: .connectionLost, "\(name): \(error)")
        }
        self.stream = stream
        switch stream.handshake() {
        case .done: break
        case .failed(let message):
            // A certificate the CA file does not vouch for, a name it does not carry: a setting to fix.
            if stream.verificationError != nil { throw RedisError(kind: .refused, "\(name): \(message)", part: .tls) }
            throw Self.failure(message, name: name)
        case .closed:
            throw RedisError(
                kind: .connectionLost,
                "\(name): the server closed the connection during the TLS handshake "
                    + "(a plain port?)")
        case .wantRead, .wantWrite:
            throw RedisError(kind: .connectionLost, "\(name): TLS handshake timed out")
        }
    }

    deinit {
        stream?.shutdown()
        close(descriptor)
    }

    /// Every later send and receive times out after `timeout` seconds.
    func setTimeout(_ timeout: Double) { Socket.setTimeouts(descriptor, timeout) }

    /// Commands already in Redis's protocol (`RESP`), written with the next `flush`.
    func append(formatted command: [UInt8]) {
        if output.isEmpty { output = command } else { output.append(contentsOf: command) }
    }

    /// An HGETALL of each of `keys`, written with the next `flush`.
    func appendHashReads(_ keys: RedisKeyList) {
        append(formatted: RESP.hashReads(keys))
    }

    func flush() throws(RedisError) {
        if let lostBecause {
            output.removeAll(keepingCapacity: true)
            throw RedisError(kind: .connectionLost, "\(lostBecause.message) (earlier; nothing sent since)")
        }
        var written = 0
        while written < output.count {
            let result = output.withUnsafeBytes { bytes in write(UnsafeRawBufferPointer(rebasing: bytes[written...])) }
            guard case .done(let count) = result else {
                // A server that closed on us may have said why first (an alert about our certificate): read it.
                if stream != nil, case .failed(let reason) = receive() { throw lost(.failed(reason), "writing") }
                throw lost(result, "writing")
            }
            written += count
        }
        output.removeAll(keepingCapacity: true)
    }

    /// The next reply, read as far as needed.
    func readReply() throws(RedisError) -> RedisReply {
        try flush()
        while true {
            if let reply = try read({ reader throws(RedisError) in try reader.next() }) { return reply }
        }
    }

    /// The next reply read as a hash, each field and value handed to `visit` in place (`RedisReplyReader.nextHash`).
    func readHash(_ visit: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> Void) throws(RedisError)
        -> RedisReplyReader.HashReply
    {
        try flush()
        while true {
            if let reply = try read({ reader throws(RedisError) in try reader.nextHash(visit) }) { return reply }
        }
    }

    /// What `parse` finds in what was received; if nothing yet, receives more first and returns nil.
    private func read<Reply>(_ parse: (RedisReplyReader) throws(RedisError) -> Reply?) throws(RedisError) -> Reply? {
        do throws(RedisError) {
            if let reply = try parse(reader) { return reply }
        } catch {
            throw noteLost(RedisError(kind: .connectionLost, "\(name): \(error.message)"))
        }
        let result = receive()
        guard case .done = result else { throw lost(result, "reading") }
        return nil
    }

    private func receive() -> TLSStream.IOResult {
        var result = TLSStream.IOResult.done(0)
        _ = reader.receive { room in
            if let stream {
                result = stream.read(into: room)
                if case .done(let count) = result { return count }
                return -1
            }
            while true {
                let count = recv(descriptor, room.baseAddress, room.count, 0)
                if count > 0 {
                    result = .done(count)
                    return count
                }
                if count == 0 {
                    result = .closed
                } else if errno == EINTR {
                    continue
                } else {
                    result =
                        errno == EAGAIN || errno == EWOULDBLOCK ? .wantRead : .failed(String(cString: strerror(errno)))
                }
                return -1
            }
        }
        return result
    }

    private func write(_ bytes: UnsafeRawBufferPointer) -> TLSStream.IOResult {
        if let stream { return stream.write(bytes) }
        while true {
            let count = send(descriptor, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL))
            if count >= 0 { return .done(count) }
            if errno == EINTR { continue }
            return errno == EAGAIN || errno == EWOULDBLOCK ? .wantWrite : .failed(String(cString: strerror(errno)))
        }
    }

    private func lost(_ result: TLSStream.IOResult, _ doing: String) -> RedisError {
        switch result {
        case .closed:
            return noteLost(RedisError(kind: .connectionLost, "\(name): connection closed while \(doing)"))
        case .failed(let message):
            return noteLost(Self.failure(message, name: name))
        default:
            return noteLost(RedisError(kind: .connectionLost, "\(name): timed out while \(doing)"))
        }
    }

    /// The connection is as good as lost (also for what its owner learns from a reply: a node that cannot serve now).
    @discardableResult
    func noteLost(_ error: RedisError) -> RedisError {
        lostBecause = lostBecause ?? error
        return error
    }

    /// The server refusing our client certificate (an alert during the handshake under TLS 1.2, on the first read
    /// under TLS 1.3) is a setting to fix, waiting will not change it; anything else is a lost connection.
    private static func failure(_ message: String, name: String) -> RedisError {
        if message.contains("certificate required") || message.contains("bad certificate")
            || message.contains("unknown ca")
        {
            return RedisError(
                kind: .refused, "\(name): the server refused the client certificate: \(message)",
                part: .clientCertificate)
        }
        return RedisError(kind: .connectionLost, "\(name): \(message)")
    }

    /// A blocking socket connected within `timeout`, whose sends and receives time out after it too.
    private static func connect(host: String, port: Int, timeout: Double, name: String) throws(RedisError) -> Int32 {
        do { return try Socket.connectBlocking(host: host, port: port, timeout: timeout) } catch {
            throw RedisError(kind: .connectionLost, "cannot connect to \(name): \(error)")
        }
    }
}
