import Foundation

/// `scheme://[user[:password]@]host[:port][/path]`: the URLs the programs are configured with (the broker's nodes,
/// Redis), split into their parts with the credentials percent-decoded, so that '/', '@', ':' or '%' can be part of
/// a password. Each caller checks the scheme before and reads the path after in its own terms (a vhost, a database).
/// An error names the part that is wrong, never a credential's text.
public struct ServiceURL: Sendable, Equatable {
    /// What a credential without a colon is: a user (AMQP), or a password (Redis, where `redis://secret@host` has
    /// long meant a password).
    public enum LoneCredential: Sendable {
        case user, password
    }

    public var scheme: Substring
    public var user: String? = nil
    public var password: String? = nil
    /// Without the brackets of an IPv6 literal.
    public var host: String
    public var port: Int? = nil
    /// What follows the first "/" after the scheme, still percent-encoded; nil without a "/".
    public var path: Substring? = nil

    /// `requiringHost`: false where a URL may carry only credentials and a path (the host is known otherwise); its
    /// host is then empty.
    public init(_ text: String, loneCredential: LoneCredential = .user, requiringHost: Bool = true)
        throws(ServiceURLError)
    {
        guard let separator = text.range(of: "://") else { throw .noScheme }
        scheme = text[..<separator.lowerBound]
        var rest = text[separator.upperBound...]
        if let slash = rest.firstIndex(of: "/") {
            path = rest[rest.index(after: slash)...]
            rest = rest[..<slash]
        }
        if let at = rest.lastIndex(of: "@") {
            (user, password) = try Self.credentials(rest[..<at], loneCredential: loneCredential)
            rest = rest[rest.index(after: at)...]
        }
        var portText: Substring?
        if rest.hasPrefix("["), let close = rest.firstIndex(of: "]") {
            let after = rest[rest.index(after: close)...]
            if after.hasPrefix(":") { portText = after.dropFirst() }
            rest = rest[rest.index(after: rest.startIndex)..<close]
        } else if let colon = rest.lastIndex(of: ":") {
            portText = rest[rest.index(after: colon)...]
            rest = rest[..<colon]
        }
        if let portText {
            guard let number = Int(portText), (1...65535).contains(number) else { throw .badPort(String(portText)) }
            port = number
        }
        guard !rest.isEmpty || !requiringHost else { throw .noHost }
        host = String(rest)
    }

    private static func credentials(_ credentials: Substring, loneCredential: LoneCredential)
        throws(ServiceURLError) -> (user: String?, password: String?)
    {
        func decoded(_ part: Substring, _ name: String) throws(ServiceURLError) -> String {
            guard let text = PercentEncoding.decode(part) else { throw .badPercentEncoding(name) }
            return text
        }
        guard let colon = credentials.firstIndex(of: ":") else {
            switch loneCredential {
            case .user: return (try decoded(credentials, "user"), nil)
            case .password: return (nil, try decoded(credentials, "password"))
            }
        }
        // A colon after the first belongs to the password.
        return (
            try decoded(credentials[..<colon], "user"),
            try decoded(credentials[credentials.index(after: colon)...], "password")
        )
    }
}

/// What is wrong with a `ServiceURL`, by part.
public enum ServiceURLError: Error, Sendable, Equatable, CustomStringConvertible {
    case noScheme
    /// `part`: "user" or "password".
    case badPercentEncoding(String)
    case badPort(String)
    case noHost

    public var description: String {
        switch self {
        case .noScheme: "no scheme (such as http://, redis:// or amqp://)"
        case .badPercentEncoding(let part): "bad percent-encoding in the \(part)"
        // Text that is not digits is not echoed: `amqp://user:secret` (no '@') puts a password where the port goes.
        case .badPort(let text) where !text.isEmpty && text.allSatisfy(\.isNumber):
            "port \(text) is not a number from 1 to 65535"
        case .badPort:
            "the port is not a number from 1 to 65535 (not shown: with no '@' before the host, a password is read "
                + "as the port)"
        case .noHost: "no host"
        }
    }
}
