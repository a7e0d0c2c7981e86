import Foundation
import Synchronization
import Telemetry
import Threads

/// Where a fleet of workers keeps one provider token per key (`FleetProviderTokens`), so that they all send with the
/// same one and replace it once, together.
public protocol ProviderTokenFleet: AnyObject, Sendable {
    /// APNs answered ExpiredProviderToken to the token issued at `issuedAt`: the fleet replaces it, once whoever asks,
    /// and `provider` adopts the replacement. Returns whether it did, within a short wait.
    func replace(_ provider: APNsTokenProvider, rejectedIssuedAt issuedAt: Int64) -> Bool
}

/// The provider token (ES256 JWT) for one key, shared by every connection of the process.
///
/// Apple: iat older than an hour is rejected (ExpiredProviderToken), and a connection must not see a new token more
/// often than every 20 minutes (TooManyProviderTokenUpdates). So one token is minted per key and replaced after
/// `refreshInterval` (default 50 minutes, kept within 20...60); an early refresh after ExpiredProviderToken is
/// allowed only when the current token is at least 20 minutes old or its clock is clearly wrong.
public final class APNsTokenProvider: Sendable {
    public static let minimumRefreshInterval: Double = 20 * 60
    public static let maximumTokenAge: Double = 60 * 60

    public let keyID: String
    public let teamID: String
    private let key: ES256Key
    private let refreshInterval: Double
    private let clock: @Sendable () -> Double
    private let current = Locked<(token: String, issuedAt: Int64)?>(nil)
    /// The fleet's shared tokens, when the worker keeps them in Redis; nil: this process signs its own.
    private let fleetHook = Locked<(any ProviderTokenFleet)?>(nil)
    /// Tokens this process minted, every key together (`apns_worker_provider_tokens_minted_total`).
    public static let minted = Atomic<Int>(0)

    public init(
        key: ES256Key, keyID: String, teamID: String, refreshInterval: Double = 50 * 60,
        clock: @escaping @Sendable () -> Double = { Date().timeIntervalSince1970 }
    ) throws(APNsKeyError) {
        for (field, value) in [(APNsKeyError.Identifier.keyID, keyID), (.teamID, teamID)] {
            guard value.utf8.count == 10, value.utf8.allSatisfy({ Self.isAlphanumeric($0) }) else {
                throw .badIdentifier(field, value: value)
            }
        }
        guard key.hasPrivateKey else { throw .unreadable("the key file holds a public key, not the private .p8 key") }
        self.key = key
        self.keyID = keyID
        self.teamID = teamID
        self.refreshInterval = min(max(refreshInterval, Self.minimumRefreshInterval), Self.maximumTokenAge - 60)
        self.clock = clock
    }

    /// The `authorization` header value, minting a token when none is fresh enough.
    public func authorization() throws(APNsKeyError) -> String { try signature().authorization }

    /// The `authorization` header value and its token's `iat`, one token's both (an answer to a request names the
    /// token it carried, which may have been replaced since).
    public func signature() throws(APNsKeyError) -> (authorization: String, issuedAt: Int64) {
        let now = clock()
        return try current.withLock { (state) throws(APNsKeyError) -> (String, Int64) in
            if let state, now - Double(state.issuedAt) < refreshInterval, Double(state.issuedAt) <= now + 60 {
                return ("bearer " + state.token, state.issuedAt)
            }
            let issuedAt = Int64(now)
            let token = try makeToken(issuedAt: issuedAt)
            state = (token, issuedAt)
            return ("bearer " + token, issuedAt)
        }
    }

    /// The fleet that shares this key's tokens from now on.
    public func share(with fleet: any ProviderTokenFleet) { fleetHook.withLock { $0 = fleet } }

    /// A token the fleet uses: taken unless this provider holds a newer one (and not one from a clock ahead).
    public func adopt(token: String, issuedAt: Int64) {
        let now = clock()
        current.withLock { state in
            if let state, state.issuedAt > issuedAt, Double(state.issuedAt) <= now + 60 { return }
            state = (token, issuedAt)
        }
    }

    /// When the token in use was issued (UNIX seconds), if there is one.
    public var currentIssuedAt: Int64? { current.withLock { $0?.issuedAt } }

    /// After 403 ExpiredProviderToken to a request that carried the token issued at `refused` (nil: the current one):
    /// if that token was replaced since, the new one is used; with a fleet, the fleet replaces the token once for
    /// every worker (a token APNs calls expired is expired on every connection); alone, drops the current token if
    /// replacing it cannot trip Apple's 20-minute rule. Returns whether a new token will be used.
    @discardableResult
    public func invalidate(refused: Int64? = nil) -> Bool {
        if let refused, let issuedAt = currentIssuedAt, issuedAt != refused { return true }
        if let fleet = fleetHook.withLock({ $0 }), let issuedAt = currentIssuedAt {
            return fleet.replace(self, rejectedIssuedAt: issuedAt)
        }
        let now = clock()
        return current.withLock { state in
            guard let issuedAt = state?.issuedAt else { return true }
            guard now - Double(issuedAt) >= Self.minimumRefreshInterval || Double(issuedAt) > now + 60 else {
                return false
            }
            state = nil
            return true
        }
    }

    /// Builds header.claims.signature, each part base64url without padding.
    public func makeToken(issuedAt: Int64) throws(APNsKeyError) -> String {
        Self.minted.add(1, ordering: .relaxed)
        let header = Self.base64URL(Array("{\"alg\":\"ES256\",\"kid\":\"\(keyID)\"}".utf8))
        let claims = Self.base64URL(Array("{\"iss\":\"\(teamID)\",\"iat\":\(issuedAt)}".utf8))
        let signingInput = header + "." + claims
        let signature = try key.sign(Array(signingInput.utf8))
        return signingInput + "." + Self.base64URL(signature)
    }

    public static func base64URL(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    public static func base64URLDecode(_ text: Substring) -> [UInt8]? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64).map(Array.init)
    }

    private static func isAlphanumeric(_ byte: UInt8) -> Bool {
        (byte >= 48 && byte <= 57) || (byte >= 65 && byte <= 90) || (byte >= 97 && byte <= 122)
    }
}
