import APNs
import Foundation
import TLS

/// APNS_CREDENTIALS_FILE: several teams' signing keys and certificates, each serving the bundle IDs it lists.
///
/// ```json
/// {"credentials": [
///   {"team_id": "TEAM000001", "key_id": "KEY0000001", "key_file": "/run/secrets/AuthKey_KEY0000001.p8",
///    "topics": ["com.example.app", "com.example.driver"], "rate_limit": 0},
///   {"cert_file": "/run/secrets/other.pem", "cert_key_file": "/run/secrets/other.key", "topics": ["com.other.app"]}
/// ]}
/// ```
///
/// A relative path is relative to the credentials file's directory. Every problem names its entry (1-based) and
/// what is wrong, never a key's content.
package struct CredentialsFile {
    package struct Entry: Equatable {
        package var proof: CredentialSettings.Proof
        package var topics: [String]
        package var rateLimit: Int
    }

    package var entries: [Entry]

    private static let tokenFields: Set<String> = ["team_id", "key_id", "key_file", "topics", "rate_limit"]
    private static let certificateFields: Set<String> = ["cert_file", "cert_key_file", "topics", "rate_limit"]

    /// Reads and checks the file's shape; keys and certificates are loaded by `CredentialSettings.makeCredentials`.
    static func read(_ path: String) throws(ConfigurationError) -> CredentialsFile {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigurationError(\.apnsCredentialsFile, "\(path): cannot be read")
        }
        return try parse(data, path: path)
    }

    /// The file's content checked; `path` names it in problems and anchors its relative paths.
    package static func parse(_ data: Data, path: String) throws(ConfigurationError) -> CredentialsFile {
        func problem(_ text: String) -> ConfigurationError {
            ConfigurationError(\.apnsCredentialsFile, "\(path): \(text)")
        }
        let document: Any
        do { document = try JSONSerialization.jsonObject(with: data) } catch {
            throw problem("not JSON (\((error as NSError).userInfo[NSDebugDescriptionErrorKey] ?? error))")
        }
        guard let top = document as? [String: Any], let list = top["credentials"] as? [Any] else {
            throw problem("wants {\"credentials\": [ ... ]}")
        }
        if let extra = top.keys.first(where: { $0 != "credentials" }) { throw problem("unknown field \"\(extra)\"") }
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent()
        var entries: [Entry] = []
        for (offset, item) in list.enumerated() {
            do throws(EntryProblem) {
                entries.append(try entry(item, directory: directory))
            } catch {
                throw problem("entry \(offset + 1)\(error.naming): \(error.text)")
            }
        }
        return CredentialsFile(entries: entries)
    }

    struct EntryProblem: Error {
        var text: String
        var naming = ""
    }

    private static func entry(_ item: Any, directory: URL) throws(EntryProblem) -> Entry {
        guard let dictionary = item as? [String: Any] else { throw EntryProblem(text: "not an object") }
        let fields = EntryFields(fields: dictionary, directory: directory)
        let (proof, allowed) = try fields.proof()
        let naming = " (\(CredentialSettings.describe(proof)))"
        if let extra = dictionary.keys.sorted().first(where: { !allowed.contains($0) }) {
            throw EntryProblem(
                text: "unknown field \"\(extra)\" for a \(allowed == tokenFields ? "signing key" : "certificate")",
                naming: naming)
        }
        do throws(EntryProblem) {
            return Entry(proof: proof, topics: try fields.topics(), rateLimit: try fields.rateLimit())
        } catch {
            throw EntryProblem(text: error.text, naming: naming)
        }
    }

    /// One entry's fields, read and checked one at a time; a relative file is relative to `directory`.
    private struct EntryFields {
        var fields: [String: Any]
        var directory: URL

        func string(_ name: String) throws(EntryProblem) -> String? {
            guard let value = fields[name] else { return nil }
            guard let text = value as? String, !text.isEmpty else {
                throw EntryProblem(text: "\"\(name)\" wants a non-empty string")
            }
            return text
        }

        func file(_ name: String) throws(EntryProblem) -> String? {
            guard let path = try string(name) else { return nil }
            return path.hasPrefix("/") ? path : directory.appendingPathComponent(path).path
        }

        /// The key or the certificate the entry names, and the fields an entry of that kind may have.
        func proof() throws(EntryProblem) -> (CredentialSettings.Proof, allowed: Set<String>) {
            if let keyFile = try file("key_file") {
                guard let keyID = try string("key_id") else {
                    throw EntryProblem(text: "\"key_id\" is required with \"key_file\"")
                }
                guard let teamID = try string("team_id") else {
                    throw EntryProblem(text: "\"team_id\" is required with \"key_file\"")
                }
                return (.signingKey(file: keyFile, keyID: keyID, teamID: teamID), CredentialsFile.tokenFields)
            }
            if let certificateFile = try file("cert_file") {
                return (
                    .certificate(file: certificateFile, keyFile: try file("cert_key_file")),
                    CredentialsFile.certificateFields
                )
            }
            throw EntryProblem(
                text: "names no credential: \"key_file\" (with \"key_id\" and \"team_id\") or \"cert_file\"")
        }

        func topics() throws(EntryProblem) -> [String] {
            guard let topics = fields["topics"] as? [Any], !topics.isEmpty else {
                throw EntryProblem(text: "\"topics\" wants a non-empty list of bundle IDs")
            }
            var bundles: [String] = []
            for topic in topics {
                guard let bundle = topic as? String, TopicSettingCheck.isValid(bundle) else {
                    throw EntryProblem(
                        text: "\"topics\" holds \(String(describing: topic).prefix(80)), not a bundle ID")
                }
                bundles.append(bundle)
            }
            return bundles
        }

        func rateLimit() throws(EntryProblem) -> Int {
            guard let value = fields["rate_limit"] else { return 0 }
            // At most APNS_RATE_LIMIT's most: the fleet's shares of a larger one overflowed in the arithmetic of
            // permits.
            guard !(value is Bool), let number = value as? NSNumber,
                let whole = Int(exactly: number.doubleValue), (0...10_000_000).contains(whole)
            else {
                throw EntryProblem(
                    text: "\"rate_limit\" wants a whole number of notifications per second from 0 to 10000000")
            }
            return whole
        }
    }
}

/// What a topic in the credentials file may be: a bundle ID, as a job's topic must be (`APNsRules.checkTopic`).
enum TopicSettingCheck {
    static func isValid(_ topic: String) -> Bool {
        !topic.isEmpty && APNsRules.topicProblem(topic) == nil
    }
}

/// Why a signing key or a client certificate cannot be used.
struct CredentialProblem: Error, CustomStringConvertible {
    var description: String
}

extension CredentialSettings {
    /// A client certificate as a connection will load it (the chain, the key, the key matching the certificate),
    /// refused when it has expired (APNs refuses its handshake: better said at start). Its expiry and a name for
    /// logs and metrics: `certificate:<common name>` (Apple's are `Apple Push Services: <bundle ID>`), else the
    /// file's name.
    static func checkCertificate(_ file: String, keyFile: String?) throws(CredentialProblem) -> (
        expiry: Date, name: String
    ) {
        let checked: (expiry: Date, commonName: String?)
        do { checked = try CertificateFile.check(certificateFile: file, keyFile: keyFile) } catch {
            throw CredentialProblem(description: "\(error)")
        }
        if checked.expiry < Date() {
            throw CredentialProblem(
                description: "the certificate expired on "
                    + "\(ISO8601DateFormatter().string(from: checked.expiry)): renew it")
        }
        let fileName = file.split(separator: "/").last.map(String.init) ?? file
        return (checked.expiry, "certificate:" + (checked.commonName ?? fileName))
    }

    /// Every credential: the file's entries (if APNS_CREDENTIALS_FILE is set) and the single-key settings as the
    /// default for every other topic. Reads and checks each key and certificate; the first problem throws, naming
    /// its entry. Called at start and on every reload.
    public func makeCredentials() throws(ConfigurationError) -> APNsCredentials {
        let fallback = try fallbackCredential()
        var entries: [APNsCredential] = []
        if let credentialsFile {
            let file = try CredentialsFile.read(credentialsFile)
            var names = Set(fallback.map { [$0.name] } ?? [])
            for (offset, entry) in file.entries.enumerated() {
                let credential: APNsCredential
                do throws(CredentialProblem) {
                    credential = try Self.fileCredential(entry, number: offset + 1, takenNames: &names)
                } catch {
                    throw ConfigurationError(
                        \.apnsCredentialsFile,
                        "\(credentialsFile): entry \(offset + 1) (\(Self.describe(entry.proof))): \(error.description)")
                }
                entries.append(credential)
            }
        }
        if fallback == nil && entries.isEmpty {
            throw ConfigurationError(
                \.apnsCredentialsFile,
                "\(credentialsFile ?? ""): lists no credential, and no "
                    + "single-key setting gives a default one")
        }
        do {
            var credentials = try APNsCredentials(entries: entries, fallback: fallback)
            credentials.defaultTopic = defaultTopic
            return credentials
        } catch {
            throw ConfigurationError(\.apnsCredentialsFile, "\(credentialsFile ?? ""): \(error)")
        }
    }

    /// The single-key settings' credential, the default for every topic no entry of the file lists; nil without them.
    private func fallbackCredential() throws(ConfigurationError) -> APNsCredential? {
        guard let proof else { return nil }
        let authentication = try makeAuthentication()
        var name = authentication.name
        var expiry: Date?
        if case .certificate(let file, let keyFile) = proof {
            do throws(CredentialProblem) {
                (expiry, name) = try Self.checkCertificate(file, keyFile: keyFile)
            } catch {
                throw ConfigurationError(\.apnsCertFile, error.description)
            }
        }
        return Self.credential(
            authentication, name: name, proof: proof, bundles: [], rateLimit: 0, certificateExpiry: expiry)
    }

    /// Entry `number` of the credentials file, its key or certificate read and checked. Its name is one no other
    /// credential took: two certificates of one name (several files called tls.crt, say) stay apart in metrics and
    /// limits.
    private static func fileCredential(
        _ entry: CredentialsFile.Entry, number: Int, takenNames: inout Set<String>
    ) throws(CredentialProblem) -> APNsCredential {
        let authentication: APNsAuthentication
        var expiry: Date?
        var name: String
        switch entry.proof {
        case .signingKey(let keyFile, let keyID, let teamID):
            do {
                authentication = .token(
                    try APNsTokenProvider(key: try ES256Key(contentsOfFile: keyFile), keyID: keyID, teamID: teamID))
            } catch { throw CredentialProblem(description: error.description) }
            name = authentication.name
        case .certificate(let certificateFile, let keyFile):
            (expiry, name) = try checkCertificate(certificateFile, keyFile: keyFile)
            authentication = .certificate(certificateFile: certificateFile, privateKeyFile: keyFile)
        }
        if takenNames.contains(name) { name += "#\(number)" }
        takenNames.insert(name)
        return credential(
            authentication, name: name, proof: entry.proof, bundles: Set(entry.topics), rateLimit: entry.rateLimit,
            certificateExpiry: expiry)
    }

    /// Every private key file the credentials read (the single-key one and each entry's): nobody but the worker's
    /// user should read them. A file that cannot be read now is left to `makeCredentials` to report.
    public func privateKeyFiles() -> [String] {
        let entries = (try? credentialsFile.map(CredentialsFile.read)) ?? nil
        return ([proof].compactMap { $0 } + (entries?.entries.map(\.proof) ?? [])).map(\.privateKeyFile)
    }

    private static func credential(
        _ authentication: APNsAuthentication, name: String, proof: Proof, bundles: Set<String>,
        rateLimit: Int, certificateExpiry: Date?
    ) -> APNsCredential {
        // Two readings of the same files are the same credential (a reload keeps its connections): the proof's
        // identifiers and the bytes of its files.
        var material = Array(describe(proof).utf8)
        for path in proof.files {
            material +=
                [0] + Array(path.utf8) + [0] + (FileManager.default.contents(atPath: path).map(Array.init) ?? [])
        }
        return APNsCredential(
            name: name, authentication: authentication, bundles: bundles,
            rateLimit: rateLimit, material: material, certificateExpiry: certificateExpiry)
    }

    /// An entry's proof in a few words, for error lines: team and key ids, or the certificate's file.
    static func describe(_ proof: Proof) -> String {
        switch proof {
        case .signingKey(_, let keyID, let teamID): "team \(teamID), key \(keyID)"
        case .certificate(let file, _): "certificate \(file)"
        }
    }
}

extension CredentialSettings.Proof {
    /// The file holding the private key: the .p8 key, or the certificate's key (which may sit in its file).
    var privateKeyFile: String {
        switch self {
        case .signingKey(let file, _, _): file
        case .certificate(let file, let keyFile): keyFile ?? file
        }
    }

    var files: [String] {
        switch self {
        case .signingKey(let file, _, _): [file]
        case .certificate(let file, let keyFile): [file] + (keyFile.map { [$0] } ?? [])
        }
    }
}
