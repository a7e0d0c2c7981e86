internal import COpenSSL
import TLS

/// A throwaway self-signed certificate for local servers (apns-sim): a P-256 key, CN and subjectAltNames for the
/// hosts given, CA:TRUE so that a client can trust it directly as its CA file.
public enum SelfSignedCertificate {
    public static func generate(
        commonName: String = "localhost",
        hosts: [String] = ["localhost", "127.0.0.1", "::1"],
        days: Int = 365
    ) throws -> (certificatePEM: String, privateKeyPEM: String) {
        OpenSSLLibrary.prepare()
        guard let key = COpenSSL_EVP_EC_gen("P-256") else { throw TLSError("key generation failed") }
        defer { EVP_PKEY_free(key) }
        guard let certificate = X509_new() else { throw TLSError("X509_new failed") }
        defer { X509_free(certificate) }
        X509_set_version(certificate, 2)
        var serial = [UInt8](repeating: 0, count: 8)
        RAND_bytes(&serial, Int32(serial.count))
        ASN1_INTEGER_set(
            X509_get_serialNumber(certificate), Int(serial.withUnsafeBytes { $0.load(as: UInt32.self) } >> 1))
        X509_gmtime_adj(X509_getm_notBefore(certificate), -3600)
        X509_gmtime_adj(X509_getm_notAfter(certificate), days * 86_400)
        X509_set_pubkey(certificate, key)
        let name = X509_get_subject_name(certificate)
        X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, commonName, -1, -1, 0)
        X509_set_issuer_name(certificate, name)

        let altNames = hosts.map { TLSStream.isIPAddress($0) ? "IP:\($0)" : "DNS:\($0)" }.joined(separator: ",")
        var context = X509V3_CTX()
        X509V3_set_ctx(&context, certificate, certificate, nil, nil, 0)
        for (nid, value) in [
            (NID_subject_alt_name, altNames), (NID_basic_constraints, "critical,CA:TRUE"),
            (NID_subject_key_identifier, "hash")
        ] {
            guard let extensionValue = X509V3_EXT_conf_nid(nil, &context, nid, value) else {
                throw TLSError("cannot build certificate extension \(value)")
            }
            X509_add_ext(certificate, extensionValue, -1)
            X509_EXTENSION_free(extensionValue)
        }
        guard X509_sign(certificate, key, EVP_sha256()) > 0 else { throw TLSError("cannot sign the certificate") }
        let certificatePEM = try PEM.text { PEM_write_bio_X509($0, certificate) }
        let keyPEM = try PEM.text { PEM_write_bio_PrivateKey($0, key, nil, nil, 0, nil, nil) }
        return (certificatePEM, keyPEM)
    }
}
