internal import COpenSSL
import Foundation

/// One credential a worker proves itself to APNs with, and the apps (bundle IDs) it serves.
///
/// Apple binds a connection to one team (token authentication) or to one certificate: every credential has
/// connections of its own. Compared by `fingerprint` (a digest of what it is made of, the key file's bytes included),
/// so that a reload that reads the same credential again keeps its connections and its provider token.
public final class APNsCredential: Sendable, CustomStringConvertible {
    /// For logs and metrics: `TEAMID/KEYID`, or `certificate:<file name>`. Never a secret.
    public let name: String
    public let authentication: APNsAuthentication
    /// The bundle IDs it serves; empty for the default credential (every bundle no other credential lists).
    public let bundles: Set<String>
    /// Notifications per second this credential may send across the fleet (0: only the fleet-wide limit).
    public let rateLimit: Int
    /// What makes two readings of a credential the same credential: the SHA-256 of what it is made of (never the
    /// key's bytes themselves, which stay in the key file and the signer).
    public let fingerprint: [UInt8]
    /// The fingerprint's first eight bytes in lower-case hex: how the fleet's shared provider tokens name the key
    /// that signed them (made once: they are looked at every few seconds).
    public let shortFingerprint: String
    /// When a client certificate expires (certificate authentication only).
    public let certificateExpiry: Date?

    public init(
        name: String, authentication: APNsAuthentication, bundles: Set<String>, rateLimit: Int = 0,
        material: [UInt8], certificateExpiry: Date? = nil
    ) {
        self.name = name
        self.authentication = authentication
        self.bundles = bundles
        self.rateLimit = rateLimit
        let fingerprint = Self.sha256(material)
        self.fingerprint = fingerprint
        shortFingerprint = fingerprint.prefix(8).map { String(format: "%02x", $0) }.joined()
        self.certificateExpiry = certificateExpiry
    }

    public var description: String { name }

    static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        let hashed = bytes.withUnsafeBytes { EVP_Digest($0.baseAddress, $0.count, &digest, &length, EVP_sha256(), nil) }
        // Not expected to fail in memory; were it to, a random fingerprint makes this reading differ from every other
        // (its connections are renewed on a reload, no harm), never equal to another failed one.
        guard hashed == 1 else { return (0..<32).map { _ in UInt8.random(in: .min ... .max) } }
        return Array(digest.prefix(Int(length)))
    }

    /// Same proof, same apps, same limit.
    func isSame(as other: APNsCredential) -> Bool {
        fingerprint == other.fingerprint && bundles == other.bundles && rateLimit == other.rateLimit
    }
}

/// Every credential of a worker: the entries of APNS_CREDENTIALS_FILE, and the default one (the single-key
/// settings) for every bundle no entry lists.
public struct APNsCredentials: Sendable {
    public let entries: [APNsCredential]
    public let fallback: APNsCredential?
    /// The topic of jobs that name none (APNS_TOPIC), which the default credential serves: for labels.
    public var defaultTopic: String?
    private let byBundle: [String: APNsCredential]

    /// A bundle listed by two entries is refused (`duplicateBundle`): which key signs its pushes would be chance.
    public init(entries: [APNsCredential], fallback: APNsCredential?) throws(APNsCredentialsError) {
        var byBundle: [String: APNsCredential] = [:]
        for (position, entry) in entries.enumerated() {
            for bundle in entry.bundles {
                if let earlier = byBundle[bundle] {
                    throw .duplicateBundle(bundle, first: earlier.name, second: entry.name, entry: position + 1)
                }
                byBundle[bundle] = entry
            }
        }
        self.entries = entries
        self.fallback = fallback
        self.byBundle = byBundle
    }

    /// Every credential, the default one last.
    public var all: [APNsCredential] { entries + (fallback.map { [$0] } ?? []) }

    /// The credential that sends `topic`: the entry listing its bundle ID (the topic without its push type's
    /// suffix), else the default one.
    public func credential(forTopic topic: String) -> APNsCredential? {
        if byBundle.isEmpty { return fallback }
        return byBundle[topic] ?? byBundle[APNsPushType.bundle(ofTopic: topic)] ?? fallback
    }

    /// `replacement` with the credentials that did not change taken from `self`: their connections and provider
    /// tokens carry on.
    func keepingUnchanged(_ replacement: APNsCredentials) -> APNsCredentials {
        let current = all
        func kept(_ credential: APNsCredential) -> APNsCredential {
            current.first { $0.isSame(as: credential) } ?? credential
        }
        // Cannot throw: the same bundles as `replacement`, which was checked.
        guard
            var merged = try? APNsCredentials(
                entries: replacement.entries.map(kept),
                fallback: replacement.fallback.map(kept))
        else { return replacement }
        merged.defaultTopic = replacement.defaultTopic
        return merged
    }
}

public enum APNsCredentialsError: Error, Sendable, Equatable, CustomStringConvertible {
    case duplicateBundle(String, first: String, second: String, entry: Int)

    public var description: String {
        switch self {
        case .duplicateBundle(let bundle, let first, let second, let entry):
            "entry \(entry) (\(second)) lists \(bundle), which \(first) serves already: a topic belongs to one credential"
        }
    }
}
