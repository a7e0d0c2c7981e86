import APNs
import COpenSSL
import Foundation
import TLS
import Telemetry
import Testing
import Threads

/// The provider token must verify with OpenSSL's own ES256 verifier, not only with our signer's code.
@Suite struct JWTTests {
    let privateKeyPEM: String
    let key: ES256Key

    init() throws {
        privateKeyPEM = try ES256Key.generatePrivateKeyPEM()
        key = try ES256Key(pem: privateKeyPEM)
    }

    @Test func tokenHasAppleHeaderAndClaims() throws {
        let provider = try APNsTokenProvider(key: key, keyID: "ABC123DEFG", teamID: "TEAM123456")
        let token = try provider.makeToken(issuedAt: 1_732_900_000)
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        #expect(parts.count == 3)
        #expect(!token.contains("="), "base64url without padding")
        let header =
            try JSONSerialization.jsonObject(with: Data(APNsTokenProvider.base64URLDecode(parts[0])!)) as! [String: Any]
        let claims =
            try JSONSerialization.jsonObject(with: Data(APNsTokenProvider.base64URLDecode(parts[1])!)) as! [String: Any]
        #expect(header["alg"] as? String == "ES256")
        #expect(header["kid"] as? String == "ABC123DEFG")
        #expect(claims["iss"] as? String == "TEAM123456")
        #expect((claims["iat"] as? NSNumber)?.int64Value == 1_732_900_000, "iat is UNIX seconds")
    }

    @Test func signatureIsRawRSAndVerifiesWithOpenSSL() throws {
        let provider = try APNsTokenProvider(key: key, keyID: "ABC123DEFG", teamID: "TEAM123456")
        let token = try provider.makeToken(issuedAt: 1_732_900_000)
        let parts = token.split(separator: ".")
        let signature = try #require(APNsTokenProvider.base64URLDecode(parts[2]))
        #expect(signature.count == 64, "ES256 in JWS is r||s, 64 bytes, not DER")
        let signingInput = Array("\(parts[0]).\(parts[1])".utf8)
        #expect(opensslVerify(publicKeyPEM: try key.publicKeyPEM, rawSignature: signature, message: signingInput))
        var tampered = signingInput
        tampered[tampered.count - 1] ^= 1
        #expect(!opensslVerify(publicKeyPEM: try key.publicKeyPEM, rawSignature: signature, message: tampered))
    }

    @Test func oneTokenIsSharedUntilTheRefreshInterval() throws {
        let now = LockedClock(1_000_000)
        let provider = try APNsTokenProvider(
            key: key, keyID: "ABC123DEFG", teamID: "TEAM123456",
            refreshInterval: 50 * 60, clock: { now.read() })
        let first = try provider.authorization()
        now.advance(49 * 60)
        #expect(try provider.authorization() == first)
        now.advance(2 * 60)
        let second = try provider.authorization()
        #expect(second != first)
        #expect(second.hasPrefix("bearer "))
    }

    @Test func expiredTokenRefreshRespectsTwentyMinutes() throws {
        let now = LockedClock(1_000_000)
        let provider = try APNsTokenProvider(key: key, keyID: "ABC123DEFG", teamID: "TEAM123456", clock: { now.read() })
        let first = try provider.authorization()
        now.advance(5 * 60)
        #expect(provider.invalidate() == false, "a new token within 20 minutes would trip TooManyProviderTokenUpdates")
        #expect(try provider.authorization() == first)
        now.advance(16 * 60)
        #expect(provider.invalidate() == true)
        #expect(try provider.authorization() != first)
    }

    @Test func identifiersMustBeTenCharacters() throws {
        #expect(throws: APNsKeyError.self) { try APNsTokenProvider(key: key, keyID: "SHORT", teamID: "TEAM123456") }
        #expect(throws: APNsKeyError.self) {
            try APNsTokenProvider(key: key, keyID: "ABC123DEFG", teamID: "TEAM-12345")
        }
    }

    @Test func rejectsKeysThatAreNotP256() throws {
        #expect(throws: APNsKeyError.self) {
            try ES256Key(pem: "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
        }
        let rsa = try opensslGenerateRSA()
        #expect(throws: APNsKeyError.notP256) { try ES256Key(pem: rsa) }
    }

    private func opensslVerify(publicKeyPEM: String, rawSignature: [UInt8], message: [UInt8]) -> Bool {
        // The BIO reads the PEM in place, so it lives only inside the bytes' scope (ASan caught the escaped pointer).
        let pem = Array(publicKeyPEM.utf8)
        let publicKey = pem.withUnsafeBytes { raw -> OpaquePointer? in
            let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count))
            defer { BIO_free(bio) }
            return PEM_read_bio_PUBKEY(bio, nil, nil, nil)
        }
        guard let publicKey else { return false }
        defer { EVP_PKEY_free(publicKey) }
        let signature = ECDSA_SIG_new()
        defer { ECDSA_SIG_free(signature) }
        let r = BN_bin2bn(rawSignature, 32, nil)
        let s = rawSignature.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + 32, 32, nil) }
        ECDSA_SIG_set0(signature, r, s)
        var der = [UInt8](repeating: 0, count: Int(i2d_ECDSA_SIG(signature, nil)))
        _ = der.withUnsafeMutableBufferPointer { buffer in
            var cursor = buffer.baseAddress
            return i2d_ECDSA_SIG(signature, &cursor)
        }
        let context = EVP_MD_CTX_new()
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestVerifyInit(context, nil, EVP_sha256(), nil, publicKey) == 1 else { return false }
        return EVP_DigestVerify(context, der, der.count, message, message.count) == 1
    }

    private func opensslGenerateRSA() throws -> String {
        let context = EVP_PKEY_CTX_new_id(EVP_PKEY_RSA, nil)
        defer { EVP_PKEY_CTX_free(context) }
        EVP_PKEY_keygen_init(context)
        EVP_PKEY_CTX_set_rsa_keygen_bits(context, 2048)
        var key: OpaquePointer?
        EVP_PKEY_keygen(context, &key)
        defer { EVP_PKEY_free(key) }
        let bio = BIO_new(BIO_s_mem())
        defer { BIO_free(bio) }
        PEM_write_bio_PrivateKey(bio, key, nil, nil, 0, nil, nil)
        var data: UnsafeMutablePointer<CChar>?
        let length = COpenSSL_BIO_get_mem_data(bio, &data)
        return String(decoding: UnsafeRawBufferPointer(start: data, count: length), as: UTF8.self)
    }
}

final class LockedClock: @unchecked Sendable {
    private let lock = NSLock()
    private var seconds: Double

    init(_ seconds: Double) { self.seconds = seconds }

    func read() -> Double { lock.withLock { seconds } }
    func advance(_ delta: Double) { lock.withLock { seconds += delta } }
}
