import APNs
import Foundation
import JSON
import Redis
import Synchronization
import Telemetry
import Threads

/// One provider token per signing key for the whole fleet, kept in Redis (the schema is in docs/contract.md):
/// - `apns:jwt:<team id>/<key id>`: string, JSON `{"token": "<jwt>", "iat": <UNIX seconds>, "key": "<fingerprint>"}`;
///   expires an hour after its `iat`, when APNs would refuse it anyway. `key` (a hash of the key file's credential, never
///   the key) tells a token signed by another key under the same ids (a test fleet, a key file swapped by mistake)
///   from this one's: such a token is never used, it is replaced.
/// - `apns:jwt-lease:<team id>/<key id>`: held for at most 10 s by the worker minting the next token.
///
/// Every worker reads the key's token at start and every `checkInterval`, and uses it. The first worker that finds
/// none, or finds it `replaceAge` old (40 minutes plus this worker's own 0-10 minutes, so that workers do not all try
/// at once), takes the lease, mints a token and stores it; the others wait for it and adopt it. An ExpiredProviderToken
/// answer replaces the token the fleet uses only if it is still the one APNs refused: one replacement for the fleet,
/// not one per worker. A worker replaces a refused token at most once every 20 minutes (Apple's interval between
/// token updates): a replacement refused again means a clock APNs disagrees with, which another token does not mend,
/// and replacing it on each refusal signed tokens in a loop. Without Redis, each provider signs its own, as a lone
/// worker does.
///
/// One thread owns the Redis connection; the lanes' threads ask it for a replacement and wait at most `replaceWait`.
public final class FleetProviderTokens: ProviderTokenFleet, @unchecked Sendable {
    static let checkInterval: Double = 5
    static let replaceWait: Double = 2
    static let leaseMilliseconds = 10_000

    private let deployment: RedisDeployment
    /// A signing key's provider, and the fingerprint that tells its tokens apart.
    public typealias Key = (provider: APNsTokenProvider, fingerprint: String)

    private let providers: @Sendable () -> [Key]
    private let logger: Logger
    private let replaceAge: Double
    private let wake = DispatchSemaphore(value: 0)
    /// Replacements asked for by the lanes' threads: the provider and the iat APNs refused, with the semaphore the
    /// asker waits on.
    private let requests = Locked<[(provider: APNsTokenProvider, rejected: Int64, done: DispatchSemaphore)]>([])
    private let stopping = Atomic<Bool>(false)
    /// The refresher thread's own connection, made again after a failure.
    private var redis: (any RedisClient)?
    /// Names this worker's hold on a lease, so that it never releases one that expired and another worker took.
    private let owner = UUID().uuidString
    /// When this worker last replaced a refused token, by key (`key(_:)`): owned by the refresher thread.
    private var refusalReplacedAt: [String: Double] = [:]
    static let releaseLease =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"

    public init(_ deployment: RedisDeployment, logger: Logger, providers: @escaping @Sendable () -> [Key]) {
        self.deployment = deployment
        self.providers = providers
        self.logger = logger
        replaceAge = 40 * 60 + Double.random(in: 0..<600)
    }

    static func key(_ provider: APNsTokenProvider) -> String { "apns:jwt:\(provider.teamID)/\(provider.keyID)" }
    static func leaseKey(_ provider: APNsTokenProvider) -> String {
        "apns:jwt-lease:\(provider.teamID)/\(provider.keyID)"
    }

    /// Adopts (or mints) every key's fleet token now, then keeps them current on a thread of its own until `stop`.
    public func start() {
        for key in providers() { key.provider.share(with: self) }
        refreshAll()
        Thread { [self] in
            while !stopping.load(ordering: .acquiring) {
                _ = wake.wait(timeout: .now() + Self.checkInterval)
                if stopping.load(ordering: .acquiring) { break }
                serveRequests()
                refreshAll()
            }
        }.start()
    }

    public func stop() {
        stopping.store(true, ordering: .releasing)
        wake.signal()
    }

    public func replace(_ provider: APNsTokenProvider, rejectedIssuedAt issuedAt: Int64) -> Bool {
        let done = DispatchSemaphore(value: 0)
        requests.withLock { $0.append((provider, issuedAt, done)) }
        wake.signal()
        guard done.wait(timeout: .now() + Self.replaceWait) == .success else { return false }
        // Another token than the refused one (older, when the refused one came from a clock ahead of this one).
        return provider.currentIssuedAt.map { $0 != issuedAt } ?? false
    }

    private func serveRequests() {
        let asked = requests.withLock { pending in
            defer { pending.removeAll() }
            return pending
        }
        let keys = providers()
        for request in asked {
            if let key = keys.first(where: { $0.provider === request.provider }) {
                fleetToken(for: key, replacing: request.rejected)
            }
            request.done.signal()
        }
    }

    private func refreshAll() {
        for key in providers() {
            key.provider.share(with: self)
            // Redis not answering: the rest wait for the next round rather than each paying the connect timeout.
            guard fleetToken(for: key, replacing: nil) else { return }
        }
    }

    /// The fleet's token for `provider`'s key, adopted: read, or minted under the lease when there is none, it is
    /// `replaceAge` old, or it is the one APNs refused (`rejected`).
    @discardableResult
    private func fleetToken(for key: Key, replacing rejected: Int64?) -> Bool {
        let provider = key.provider
        do {
            let redis = try connection()
            let deadline = Date().addingTimeInterval(Double(Self.leaseMilliseconds) / 1000)
            while true {
                let now = Date().timeIntervalSince1970
                // Fresh enough, not from a clock ahead of this one, and newer than the token APNs refused, if one was.
                func usable(_ stored: (token: String, issuedAt: Int64)?) -> (token: String, issuedAt: Int64)? {
                    guard let stored, Double(stored.issuedAt) > now - replaceAge, Double(stored.issuedAt) <= now + 60,
                        stored.issuedAt > (rejected ?? .min)
                    else { return nil }
                    return stored
                }
                if let stored = usable(try read(key, on: redis)) {
                    provider.adopt(token: stored.token, issuedAt: stored.issuedAt)
                    return true
                }
                if rejected != nil, let last = refusalReplacedAt[Self.key(provider)],
                    now - last < APNsTokenProvider.minimumRefreshInterval
                {
                    return true
                }
                let lease = try redis.command([
                    "SET", Self.leaseKey(provider), owner, "NX", "PX",
                    String(Self.leaseMilliseconds)
                ])
                if lease.text == "OK" {
                    // Given back at once (if still this worker's): another worker that must mint for the same ids (its
                    // key is another one) does not wait for the lease to expire.
                    defer {
                        _ = try? redis.command(["EVAL", Self.releaseLease, "1", Self.leaseKey(provider), owner])
                    }
                    // Another worker may have stored one between the read and the lease.
                    if let stored = usable(try read(key, on: redis)) {
                        provider.adopt(token: stored.token, issuedAt: stored.issuedAt)
                        return true
                    }
                    try mint(key, on: redis, now: now, replacing: rejected)
                    return true
                }
                guard Date() < deadline, !stopping.load(ordering: .acquiring) else { return true }
                Thread.sleep(forTimeInterval: 0.05)
            }
        } catch {
            // Without the fleet's token, the provider signs its own when it needs one (as a lone worker does).
            redis = nil
            logger.warning(
                "the fleet's provider token cannot be read or stored; this worker signs its own meanwhile",
                ["apns.key": "\(provider.teamID)/\(provider.keyID)", "error": "\(error)"])
            return false
        }
    }

    /// Signs a token for `key`'s provider, stores it as the fleet's (under the lease the caller holds) and adopts it.
    private func mint(_ key: Key, on redis: any RedisClient, now: Double, replacing rejected: Int64?) throws {
        let provider = key.provider
        // Newer than the refused token (issued in this second, or a little ahead by another worker's clock), so that
        // every worker holding it takes the replacement; one refused from a clock more than a minute ahead is replaced
        // by one of now, not later still.
        var issuedAt = Int64(now)
        if let rejected, rejected >= issuedAt, Double(rejected) <= now + 60 { issuedAt = rejected + 1 }
        let token = try provider.makeToken(issuedAt: issuedAt)
        let record =
            "{\"token\":\(JSONString.quote(token)),\"iat\":\(issuedAt),"
            + "\"key\":\(JSONString.quote(key.fingerprint))}"
        let stored = try redis.command(["SET", Self.key(provider), record, "EX", "3600"])
        if case .error(let message) = stored {
            throw RedisError(kind: .server, "storing the provider token: \(message)")
        }
        provider.adopt(token: token, issuedAt: issuedAt)
        if rejected != nil { refusalReplacedAt[Self.key(provider)] = now }
        logger.info(
            "minted the fleet's provider token",
            [
                "apns.key": "\(provider.teamID)/\(provider.keyID)", "apns.token_iat": String(issuedAt),
                "apns.replaces_refused": rejected.map(String.init) ?? "none"
            ])
    }

    private func connection() throws -> any RedisClient {
        if let redis { return redis }
        let made = try deployment.connect(timeout: 2, logger: logger)
        redis = made
        return made
    }

    /// The fleet's token for `key`, if there is one signed by that very key.
    private func read(_ key: Key, on redis: any RedisClient) throws -> (token: String, issuedAt: Int64)? {
        let reply = try redis.command(["GET", Self.key(key.provider)])
        if case .error(let message) = reply {
            throw RedisError(kind: .server, "reading the provider token: \(message)")
        }
        // The project's own reader: Foundation's, with its casts, cost about as much as a few hundred jobs each time
        // the token was looked at. A record this reader refuses (a repeated key, not JSON) is none: a fresh token is
        // minted under the lease, as for a missing one.
        guard let text = reply.text,
            let object = try? JSONReader.parse(Array(text.utf8), maximumDepth: 8, allowsDuplicateKeys: false),
            case .string(let token)? = object["token"], case .number(let iat)? = object["iat"],
            let issuedAt = Int64(iat) ?? Double(iat).flatMap({ Int64(exactly: $0.rounded(.down)) }),
            case .string(let fingerprint)? = object["key"], fingerprint == key.fingerprint
        else {
            return nil
        }
        return (token, issuedAt)
    }
}
