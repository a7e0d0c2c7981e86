internal import COpenSSL
import Foundation
import HTTP2
import Synchronization
import TLS

/// A P-256 key from a PKCS#8 PEM (.p8) file, the owner of its EVP_PKEY. Signs (or verifies) ES256:
/// SHA-256 then ECDSA, the signature as raw r||s (64 bytes), not DER, as JWS requires.
public final class ES256Key: @unchecked Sendable {
    // Invariant: the EVP_PKEY is never mutated after init; each operation uses its own EVP_MD_CTX.
    private let key: OpaquePointer
    public let hasPrivateKey: Bool

    /// Reads a private key (`-----BEGIN PRIVATE KEY-----`), or a public key (`-----BEGIN PUBLIC KEY-----`) to verify.
    public init(pem: String) throws(APNsKeyError) {
        OpenSSLLibrary.prepare()
        // A memory BIO is read once, so each attempt gets its own; a failed attempt leaves nothing in OpenSSL's
        // error queue for the next one.
        func readKey(_ read: (OpaquePointer) -> OpaquePointer?) -> OpaquePointer? {
            try? PEM.withMemoryBIO(pem) { bio in
                defer { ERR_clear_error() }
                return read(bio)
            }
        }
        let loaded: OpaquePointer
        let isPrivate: Bool
        if let privateKey = readKey({ PEM_read_bio_PrivateKey($0, nil, nil, nil) }) {
            (loaded, isPrivate) = (privateKey, true)
        } else if let publicKey = readKey({ PEM_read_bio_PUBKEY($0, nil, nil, nil) }) {
            (loaded, isPrivate) = (publicKey, false)
        } else {
            throw .unreadable("not a PEM private or public key")
        }
        // Checked before `self` owns the key: once it does, a throw would run deinit and free it.
        var groupName = [CChar](repeating: 0, count: 64)
        guard EVP_PKEY_get_base_id(loaded) == EVP_PKEY_EC,
            EVP_PKEY_get_group_name(loaded, &groupName, groupName.count, nil) == 1,
            ["prime256v1", "P-256"].contains(
                String(
                    decoding: groupName.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) },
                    as: UTF8.self))
        else {
            EVP_PKEY_free(loaded)
            throw .notP256
        }
        key = loaded
        hasPrivateKey = isPrivate
    }

    public convenience init(contentsOfFile path: String) throws(APNsKeyError) {
        let text: String
        do { text = try String(contentsOfFile: path, encoding: .utf8) } catch {
            throw .unreadable("cannot read \(path) (missing, a directory, unreadable or not UTF-8)")
        }
        try self.init(pem: text)
    }

    deinit { EVP_PKEY_free(key) }

    /// A new P-256 key as PKCS#8 PEM, the format of Apple's .p8 files (for tests, demos and the simulator).
    public static func generatePrivateKeyPEM() throws(APNsKeyError) -> String {
        OpenSSLLibrary.prepare()
        guard let key = COpenSSL_EVP_EC_gen("P-256") else { throw .unreadable("key generation failed") }
        defer { EVP_PKEY_free(key) }
        return try pemText { PEM_write_bio_PrivateKey($0, key, nil, nil, 0, nil, nil) }
    }

    public var publicKeyPEM: String {
        get throws(APNsKeyError) { try Self.pemText { PEM_write_bio_PUBKEY($0, key) } }
    }

    public func sign(_ message: [UInt8]) throws(APNsKeyError) -> [UInt8] {
        guard hasPrivateKey else { throw .signingFailed("this is a public key") }
        guard let context = EVP_MD_CTX_new() else { throw .signingFailed("out of memory") }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, key) == 1 else {
            throw .signingFailed("EVP_DigestSignInit")
        }
        var derLength = 0
        guard EVP_DigestSign(context, nil, &derLength, message, message.count) == 1 else {
            throw .signingFailed("EVP_DigestSign (size)")
        }
        var der = [UInt8](repeating: 0, count: derLength)
        guard EVP_DigestSign(context, &der, &derLength, message, message.count) == 1 else {
            throw .signingFailed("EVP_DigestSign")
        }
        return try Self.rawSignature(fromDER: Array(der.prefix(derLength)))
    }

    /// Checks a raw r||s signature over `message`.
    public func verify(_ signature: [UInt8], of message: [UInt8]) -> Bool {
        guard signature.count == 64, let der = Self.derSignature(fromRaw: signature),
            let context = EVP_MD_CTX_new()
        else { return false }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestVerifyInit(context, nil, EVP_sha256(), nil, key) == 1 else { return false }
        let result = EVP_DigestVerify(context, der, der.count, message, message.count)
        ERR_clear_error()
        return result == 1
    }

    private static func rawSignature(fromDER der: [UInt8]) throws(APNsKeyError) -> [UInt8] {
        var cursor: UnsafePointer<UInt8>? = nil
        let signature: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            cursor = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, buffer.count)
        }
        guard let signature else { throw .signingFailed("DER signature did not parse") }
        defer { ECDSA_SIG_free(signature) }
        var r: OpaquePointer?
        var s: OpaquePointer?
        ECDSA_SIG_get0(signature, &r, &s)
        var raw = [UInt8](repeating: 0, count: 64)
        let written = raw.withUnsafeMutableBufferPointer { buffer in
            BN_bn2binpad(r, buffer.baseAddress, 32) + BN_bn2binpad(s, buffer.baseAddress! + 32, 32)
        }
        guard written == 64 else { throw .signingFailed("r or s longer than 32 bytes") }
        return raw
    }

    private static func derSignature(fromRaw raw: [UInt8]) -> [UInt8]? {
        guard let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        let r = BN_bin2bn(raw, 32, nil)
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + 32, 32, nil) }
        guard ECDSA_SIG_set0(signature, r, s) == 1 else {
            BN_free(r)
            BN_free(s)
            return nil
        }
        let length = i2d_ECDSA_SIG(signature, nil)
        guard length > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        _ = der.withUnsafeMutableBufferPointer { buffer in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            return i2d_ECDSA_SIG(signature, &cursor)
        }
        return der
    }

    /// PEM text through the TLS layer's writer, its failure in this key's terms.
    private static func pemText(_ write: (OpaquePointer) -> Int32) throws(APNsKeyError) -> String {
        do { return try PEM.text(write) } catch { throw .unreadable("PEM encoding failed: \(error)") }
    }
}

public enum APNsKeyError: Error, Sendable, Equatable, CustomStringConvertible {
    case unreadable(String)
    case notP256
    case signingFailed(String)
    case badIdentifier(Identifier, value: String)

    /// Which identifier of a token-signing key.
    public enum Identifier: String, Sendable, Equatable {
        case keyID = "key id"
        case teamID = "team id"
    }

    public var description: String {
        switch self {
        case .unreadable(let why): "APNs key: \(why)"
        case .notP256: "APNs key: not an EC P-256 key (Apple's .p8 keys are)"
        case .signingFailed(let why): "APNs key: signing failed: \(why)"
        case .badIdentifier(let field, let value):
            "the \(field.rawValue) must be 10 letters or digits, as Apple issues it (got \(value.count) characters)"
        }
    }
}
