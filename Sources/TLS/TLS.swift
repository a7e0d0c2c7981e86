internal import COpenSSL
import Foundation

/// An error from OpenSSL, with the library's own reason text.
public struct TLSError: Error, CustomStringConvertible, Sendable {
    /// The file a client context could not load, so that the setting that names it can be named.
    public enum File: Sendable { case trustedCertificates, certificate, privateKey }

    public let message: String
    public let file: File?
    public var description: String { message }

    package init(_ what: String, file: File? = nil) {
        self.file = file
        var reasons: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            reasons.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        message = reasons.isEmpty ? what : "\(what): \(reasons.joined(separator: "; "))"
    }
}

extension TLSError {
    /// Whether `path` holds certificates OpenSSL loads as trusted ones (PEM): checked where settings are read, so that
    /// a file that is no CA bundle stops start-up instead of failing every connection it is meant for.
    public static func checkCAFile(_ path: String) throws(TLSError) {
        guard let context = SSL_CTX_new(TLS_client_method()) else { throw TLSError("cannot make a TLS context") }
        defer { SSL_CTX_free(context) }
        guard SSL_CTX_load_verify_locations(context, path, nil) == 1 else {
            throw TLSError("cannot load CA file \(path)", file: .trustedCertificates)
        }
    }
}

/// How a client checks the server and proves who it is.
public struct TLSClientConfiguration: Sendable {
    /// Extra trusted CA bundle (PEM), added to the system trust store, for private endpoints such as apns-sim.
    public var caFile: String?
    /// Peer verification with hostname check. Turning it off is for tests only and is logged loudly by callers.
    public var verifyPeer: Bool
    /// TLS client certificate (PEM) and its key, for APNs certificate authentication.
    public var certificateFile: String?
    public var privateKeyFile: String?
    /// ALPN protocols offered, most wanted first (none: no ALPN, as Redis expects).
    public var applicationProtocols: [String]

    public init(
        caFile: String? = nil, verifyPeer: Bool = true, certificateFile: String? = nil,
        privateKeyFile: String? = nil, applicationProtocols: [String] = ["h2"]
    ) {
        self.caFile = caFile
        self.verifyPeer = verifyPeer
        self.certificateFile = certificateFile
        self.privateKeyFile = privateKeyFile
        self.applicationProtocols = applicationProtocols
    }
}

/// OpenSSL, set up once per process before anything else of it is used (every wrapper calls `prepare()` first).
///
/// Without its exit handler: by default OpenSSL frees its global state from atexit, and a thread still releasing a
/// connection or a key at that moment (the worker's thread, as `main` returns) then crashed in SSL_CTX_free on the
/// freed state (seen under the thread sanitizer). The process's memory goes back to the system at exit anyway.
public enum OpenSSLLibrary {
    private static let prepared: Bool = OPENSSL_init_crypto(UInt64(OPENSSL_INIT_NO_ATEXIT), nil) == 1

    /// Idempotent and thread-safe (a lazily initialised static).
    public static func prepare() { _ = prepared }
}

/// Owner of one SSL_CTX, shared read-only by every connection made from it (OpenSSL allows that once configured).
package final class TLSContext: @unchecked Sendable {
    // Invariant: the SSL_CTX is fully configured in init and never changed afterwards.
    package let context: OpaquePointer
    package let verifiesPeer: Bool

    /// Takes ownership of `method`'s new SSL_CTX at once, so every early throw below frees it.
    private init(method: OpaquePointer, verifiesPeer: Bool) throws {
        guard let context = SSL_CTX_new(method) else { throw TLSError("SSL_CTX_new failed") }
        self.context = context
        self.verifiesPeer = verifiesPeer
        // TLS 1.2 or later, as APNs requires; no compression (CRIME).
        _ = COpenSSL_SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION)
        SSL_CTX_set_options(context, COpenSSL_SSL_OP_ALL() | COpenSSL_SSL_OP_NO_COMPRESSION())
        // Partial writes let one SSL_write carry what the socket takes now and the rest later.
        _ = COpenSSL_SSL_CTX_set_mode(context, COpenSSL_SSL_MODE_partial_and_moving_writes())
    }

    deinit { SSL_CTX_free(context) }

    package static func client(_ configuration: TLSClientConfiguration) throws -> TLSContext {
        OpenSSLLibrary.prepare()
        let owner = try TLSContext(method: TLS_client_method(), verifiesPeer: configuration.verifyPeer)
        let context = owner.context
        if configuration.verifyPeer {
            guard SSL_CTX_set_default_verify_paths(context) == 1 else {
                throw TLSError("cannot load the system trust store")
            }
            if let caFile = configuration.caFile {
                guard SSL_CTX_load_verify_locations(context, caFile, nil) == 1 else {
                    throw TLSError("cannot load CA file \(caFile)", file: .trustedCertificates)
                }
            }
            SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
        } else {
            SSL_CTX_set_verify(context, SSL_VERIFY_NONE, nil)
        }
        if let certificate = configuration.certificateFile {
            guard SSL_CTX_use_certificate_chain_file(context, certificate) == 1 else {
                throw TLSError("cannot load client certificate \(certificate)", file: .certificate)
            }
            let keyFile = configuration.privateKeyFile ?? certificate
            guard SSL_CTX_use_PrivateKey_file(context, keyFile, SSL_FILETYPE_PEM) == 1,
                SSL_CTX_check_private_key(context) == 1
            else {
                throw TLSError("cannot load the client certificate's key \(keyFile)", file: .privateKey)
            }
        }
        let alpn = configuration.applicationProtocols.flatMap { [UInt8($0.utf8.count)] + Array($0.utf8) }
        if !alpn.isEmpty {
            guard SSL_CTX_set_alpn_protos(context, alpn, UInt32(alpn.count)) == 0 else {
                throw TLSError("cannot offer ALPN \(configuration.applicationProtocols.joined(separator: ", "))")
            }
        }
        return owner
    }

    /// `clientCertificateCA`: when set, clients must present a certificate issued by (or equal to) this PEM
    /// certificate, as APNs requires on certificate-authenticated connections.
    /// `clientCertificateOptional`: a client may also come without a certificate (one that presents one must still
    /// present a good one), as APNs serves token and certificate authentication on the same hosts.
    package static func server(
        certificatePEM: String, privateKeyPEM: String, clientCertificateCA: String? = nil,
        clientCertificateOptional: Bool = false
    ) throws -> TLSContext {
        OpenSSLLibrary.prepare()
        let owner = try TLSContext(method: TLS_server_method(), verifiesPeer: false)
        let context = owner.context
        let certificate = try PEM.readCertificate(certificatePEM)
        defer { X509_free(certificate) }
        let key = try PEM.readPrivateKey(privateKeyPEM)
        defer { EVP_PKEY_free(key) }
        guard SSL_CTX_use_certificate(context, certificate) == 1,
            SSL_CTX_use_PrivateKey(context, key) == 1
        else { throw TLSError("cannot use the server certificate") }
        SSL_CTX_set_alpn_select_cb(context, selectH2, nil)
        if let clientCertificateCA {
            let authority = try PEM.readCertificate(clientCertificateCA)
            defer { X509_free(authority) }
            guard X509_STORE_add_cert(SSL_CTX_get_cert_store(context), authority) == 1 else {
                throw TLSError("cannot trust the client certificate CA")
            }
            SSL_CTX_set_verify(
                context,
                clientCertificateOptional
                    ? SSL_VERIFY_PEER
                    : SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nil)
        }
        return owner
    }
}

/// Server side ALPN: h2 or nothing, since this server speaks nothing else.
private func selectH2(
    _ ssl: OpaquePointer?, _ out: UnsafeMutablePointer<UnsafePointer<UInt8>?>?,
    _ outLength: UnsafeMutablePointer<UInt8>?, _ input: UnsafePointer<UInt8>?, _ inputLength: UInt32,
    _ argument: UnsafeMutableRawPointer?
) -> Int32 {
    guard let input else { return SSL_TLSEXT_ERR_ALERT_FATAL }
    var index = 0
    while index < Int(inputLength) {
        let length = Int(input[index])
        if length == 2, index + 2 < Int(inputLength), input[index + 1] == UInt8(ascii: "h"),
            input[index + 2] == UInt8(ascii: "2")
        {
            out?.pointee = input + index + 1
            outLength?.pointee = 2
            return SSL_TLSEXT_ERR_OK
        }
        index += 1 + length
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL
}

/// PEM text in and out of OpenSSL objects: the TLS contexts here and the APNs signing key (module APNs) share it.
package enum PEM {
    package static func withMemoryBIO<T>(_ text: String, _ body: (OpaquePointer) throws -> T) throws -> T {
        // The BIO reads the bytes in place: it must not outlive the buffer it was given.
        let bytes = Array(text.utf8)
        return try bytes.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else {
                throw TLSError("BIO_new_mem_buf failed")
            }
            defer { BIO_free(bio) }
            return try body(bio)
        }
    }

    package static func readCertificate(_ text: String) throws -> OpaquePointer {
        try withMemoryBIO(text) { bio in
            guard let certificate = PEM_read_bio_X509(bio, nil, nil, nil) else {
                throw TLSError("not a PEM certificate")
            }
            return certificate
        }
    }

    package static func readPrivateKey(_ text: String) throws -> OpaquePointer {
        try withMemoryBIO(text) { bio in
            guard let key = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else { throw TLSError("not a PEM private key") }
            return key
        }
    }

    package static func text(_ write: (OpaquePointer) -> Int32) throws -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { throw TLSError("BIO_new failed") }
        defer { BIO_free(bio) }
        guard write(bio) == 1 else { throw TLSError("PEM write failed") }
        var data: UnsafeMutablePointer<CChar>?
        let length = COpenSSL_BIO_get_mem_data(bio, &data)
        guard let data, length > 0 else { throw TLSError("PEM write produced nothing") }
        return String(decoding: UnsafeRawBufferPointer(start: data, count: length), as: UTF8.self)
    }
}

/// Owner of one SSL object and the socket's bytes. Used only by the connection that made it.
///
/// OpenSSL does not touch the socket: it reads and writes ciphertext through a BIO pair, and this stream moves the
/// bytes between the pair and the socket itself. One read(2) then brings in every TLS record that has arrived (a
/// server that answers each response in its own record would otherwise cost two reads per response: header, then
/// body), one write(2) sends every record made since the last, and on a non-blocking socket a read that came back
/// short means the socket is empty: the next record is waited for in poll(2), not asked for with a read that fails
/// with EAGAIN. `socketReadable()` tells the stream that poll saw the socket readable again.
package final class TLSStream {
    package enum IOResult: Equatable {
        case done(Int)
        case wantRead
        case wantWrite
        case closed
        case failed(String)
    }

    package let ssl: OpaquePointer
    private let fileDescriptor: Int32
    /// Our end of the pair; the SSL object owns the other.
    private let network: OpaquePointer
    /// Room for ciphertext in each direction: several full TLS records, so that SSL_write of a batch of frames and a
    /// socket read of everything that arrived each take one call.
    private static let pairBufferSize = 64 * 1024
    /// A blocking socket (Redis's) waits in read(2); a non-blocking one's short read means nothing more for now.
    private let socketBlocks: Bool
    private var socketDrained = false
    private var socketClosed = false

    package init(context: TLSContext, fileDescriptor: Int32, serverName: String?) throws {
        guard let ssl = SSL_new(context.context) else { throw TLSError("SSL_new failed") }
        var inside: OpaquePointer?
        var outside: OpaquePointer?
        guard BIO_new_bio_pair(&inside, Self.pairBufferSize, &outside, Self.pairBufferSize) == 1, let inside,
            let outside
        else {
            SSL_free(ssl)
            throw TLSError("BIO_new_bio_pair failed")
        }
        self.ssl = ssl
        self.network = outside
        self.fileDescriptor = fileDescriptor
        socketBlocks = fcntl(fileDescriptor, F_GETFL) & O_NONBLOCK == 0
        SSL_set_bio(ssl, inside, inside)
        if let serverName {
            if Self.isIPAddress(serverName) {
                if context.verifiesPeer {
                    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), serverName)
                }
            } else {
                _ = COpenSSL_SSL_set_tlsext_host_name(ssl, serverName)
                if context.verifiesPeer { SSL_set1_host(ssl, serverName) }
            }
            SSL_set_connect_state(ssl)
        } else {
            SSL_set_accept_state(ssl)
        }
    }

    deinit {
        SSL_free(ssl)
        BIO_free(network)
    }

    package static func isIPAddress(_ host: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }

    /// poll(2) saw the socket readable: the next read that needs bytes asks the socket again.
    package func socketReadable() { socketDrained = false }

    // OpenSSL's error queue is per thread, and one loop thread drives many connections: SSL_get_error reads that
    // queue, so an error one connection left behind would make the next connection's ordinary "want read" look
    // fatal and close it (a client that dropped its connection without close_notify closed the others'). Every
    // call starts with an empty queue, and `classify` leaves it empty. (Made again on an emptied queue after a
    // failure instead, a call cannot tell the peer's close from its fatal alert: both end the same way.)

    package func handshake() -> IOResult {
        perform(what: "TLS handshake") { SSL_do_handshake($0) }
    }

    package func read(into buffer: UnsafeMutableRawBufferPointer) -> IOResult {
        perform(what: "TLS read", reads: true) { SSL_read($0, buffer.baseAddress, Int32(buffer.count)) }
    }

    /// Encrypts what fits and sends what the socket takes; ciphertext the socket does not take yet stays in the pair
    /// and leaves with the next call or `sendPendingOutput()`.
    package func write(_ buffer: UnsafeRawBufferPointer) -> IOResult {
        perform(what: "TLS write") { SSL_write($0, buffer.baseAddress, Int32(buffer.count)) }
    }

    /// Sends the ciphertext waiting in the pair: `.done(0)` once all of it left, `.wantWrite` while the socket is full.
    package func sendPendingOutput() -> IOResult {
        switch sendPending() {
        case .failed(let message): return .failed(message)
        case .blocked: return .wantWrite
        case .sent: return .done(0)
        }
    }

    package func shutdown() {
        ERR_clear_error()
        SSL_shutdown(ssl)
        ERR_clear_error()
        _ = sendPending()
    }

    /// Runs one SSL call, moving ciphertext between the pair and the socket until the call succeeds or must wait.
    /// A read goes on reading when sending failed: a peer that closed on us may have said why first (an alert).
    private func perform(what: String, reads: Bool = false, _ call: (OpaquePointer) -> Int32) -> IOResult {
        while true {
            // Looked at before it is cleared: clearing walks all its slots, and a call happens for every record.
            if ERR_peek_error() != 0 { ERR_clear_error() }
            let result = call(ssl)
            // On a non-blocking socket, a read that returned data leaves what it wrote into the pair (an answer to a
            // post-handshake message) for the read that wants more, which ends every drain of the socket: one look
            // into the pair fewer for each record read. A blocking socket's owner reads what it waits for and no
            // more, so there, as for a write or a handshake, it goes at once.
            if reads && result > 0 && !socketBlocks { return .done(Int(result)) }
            let sending = sendPending()
            if case .failed(let message) = sending, !reads {
                ERR_clear_error()
                return .failed(message)
            }
            if result > 0 { return .done(Int(result)) }
            let error = SSL_get_error(ssl, result)
            switch error {
            case SSL_ERROR_WANT_READ:
                switch receive() {
                case .received: continue
                case .drained:
                    if case .failed(let message) = sending { return .failed(message) }
                    // Handshake messages that could not leave yet must go before the answer can come.
                    if case .blocked = sending { return .wantWrite }
                    return .wantRead
                case .closed: return .closed
                case .failed(let message): return .failed(message)
                }
            case SSL_ERROR_WANT_WRITE:
                // The pair is full of ciphertext: go on once the socket took some.
                if case .sent = sending { continue }
                if case .failed(let message) = sending { return .failed(message) }
                return .wantWrite
            default:
                return classify(result, error: error, what: what)
            }
        }
    }

    private enum Sending {
        case sent, blocked
        case failed(String)
    }

    /// Writes what the pair holds to the socket, as far as it takes it.
    private func sendPending() -> Sending {
        while true {
            var data: UnsafeMutablePointer<CChar>?
            let available = BIO_nread0(network, &data)
            guard available > 0, let start = data else { return .sent }
            let written = Glibc.write(fileDescriptor, start, Int(available))
            if written < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { return .blocked }
                let failure = "TLS write: \(String(cString: strerror(errno)))"
                // What cannot leave is dropped, so that no later call tries again.
                while case let count = BIO_nread0(network, &data), count > 0 { _ = BIO_nread(network, &data, count) }
                return .failed(failure)
            }
            _ = BIO_nread(network, &data, Int32(written))
            if written < Int(available) { return .blocked }
        }
    }

    private enum Receiving {
        case received, drained, closed
        case failed(String)
    }

    /// Reads what the socket holds into the pair, in one read(2) as far as the pair's contiguous room allows.
    private func receive() -> Receiving {
        if socketClosed { return .closed }
        if socketDrained { return .drained }
        var room: UnsafeMutablePointer<CChar>?
        let capacity = BIO_nwrite0(network, &room)
        guard capacity > 0, let start = room else { return .failed("TLS read: no room for incoming records") }
        while true {
            let count = Glibc.read(fileDescriptor, start, Int(capacity))
            if count > 0 {
                _ = BIO_nwrite(network, &room, Int32(count))
                if !socketBlocks && count < Int(capacity) { socketDrained = true }
                return .received
            }
            if count == 0 {
                socketClosed = true
                return .closed
            }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK {
                // A blocking socket's receive timeout ran out; a non-blocking one is empty.
                if !socketBlocks { socketDrained = true }
                return .drained
            }
            return .failed("TLS read: \(String(cString: strerror(errno)))")
        }
    }

    package var negotiatedProtocol: String? {
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length > 0 else { return nil }
        return String(decoding: UnsafeBufferPointer(start: data, count: Int(length)), as: UTF8.self)
    }

    /// The common name of the certificate the peer presented and the handshake verified, if any.
    package var peerCertificateCommonName: String? {
        guard let certificate = SSL_get1_peer_certificate(ssl) else { return nil }
        defer { X509_free(certificate) }
        guard SSL_get_verify_result(ssl) == X509_V_OK else { return nil }
        return CertificateFile.commonName(of: certificate)
    }

    package var verificationError: String? {
        let result = SSL_get_verify_result(ssl)
        guard result != X509_V_OK else { return nil }
        return String(cString: X509_verify_cert_error_string(result))
    }

    private func classify(_ result: Int32, error: Int32, what: String) -> IOResult {
        defer { ERR_clear_error() }
        switch error {
        case SSL_ERROR_ZERO_RETURN: return .closed
        case SSL_ERROR_SYSCALL:
            let error = TLSError(what)
            if error.message == what { return .closed }
            return .failed(error.message)
        default:
            var message = TLSError(what).message
            // Only where the peer's certificate is checked: otherwise a self-signed one, accepted, would be named.
            if SSL_get_verify_mode(ssl) != SSL_VERIFY_NONE, let verification = verificationError {
                message += " (certificate: \(verification))"
            }
            return .failed(message)
        }
    }
}

/// What a certificate file says about itself.
public enum CertificateFile {
    /// A client certificate as a TLS connection would load it: the certificate chain, the private key (in
    /// `keyFile`, or in the certificate file), and that the key is the certificate's. Throws what is wrong; returns
    /// when the certificate expires and its subject's common name.
    public static func check(certificateFile: String, keyFile: String?) throws -> (expiry: Date, commonName: String?) {
        _ = try TLSContext.client(
            TLSClientConfiguration(
                verifyPeer: false, certificateFile: certificateFile,
                privateKeyFile: keyFile))
        return (try expiry(ofPEMFile: certificateFile), try commonName(ofPEMFile: certificateFile))
    }

    /// The common name of the first certificate in the PEM file, if it has one.
    public static func commonName(ofPEMFile path: String) throws -> String? {
        try withCertificate(path) { commonName(of: $0) }
    }

    static func commonName(of certificate: OpaquePointer) -> String? {
        guard let subject = X509_get_subject_name(certificate) else { return nil }
        var buffer = [CChar](repeating: 0, count: 256)
        let length = X509_NAME_get_text_by_NID(subject, NID_commonName, &buffer, Int32(buffer.count))
        guard length > 0 else { return nil }
        return String(decoding: buffer.prefix(Int(length)).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    private static func withCertificate<T>(_ path: String, _ body: (OpaquePointer) throws -> T) throws -> T {
        OpenSSLLibrary.prepare()
        guard let bio = BIO_new_file(path, "r") else { throw TLSError("cannot read certificate file \(path)") }
        defer { BIO_free(bio) }
        guard let certificate = PEM_read_bio_X509(bio, nil, nil, nil) else {
            throw TLSError("\(path) holds no PEM certificate")
        }
        defer { X509_free(certificate) }
        return try body(certificate)
    }

    /// When the first certificate in the PEM file expires (its notAfter).
    public static func expiry(ofPEMFile path: String) throws -> Date {
        try withCertificate(path) { certificate in
            var moment = tm()
            guard let notAfter = X509_get0_notAfter(certificate), ASN1_TIME_to_tm(notAfter, &moment) == 1 else {
                throw TLSError("\(path): unreadable expiry date")
            }
            return Date(timeIntervalSince1970: TimeInterval(timegm(&moment)))
        }
    }
}
