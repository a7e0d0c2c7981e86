import Redis
import RedisStore
import WorkerPipeline

/// The cache changes registration events ask for, kept in the order the events came.
///
/// Why the order: an event without a time of its own is stamped with the time it is read, which one batch shares. A
/// logout and a login of one token in one batch then have the same time, and the cache lets a logout remove a token
/// unless it was registered after; applied logins first and logouts after, a logout followed by a login lost the
/// token. Applied in their order, the later one wins, as it would have one batch apart.
struct RegistrationChanges {
    enum Change {
        case register(TokenRegistration)
        case unregister(TokenRemoval)

        var isRegistration: Bool {
            if case .register = self { return true }
            return false
        }
    }

    private(set) var changes: [Change] = []

    mutating func append(_ event: RegistrationEvent) {
        switch event.action {
        case .register:
            changes.append(.register(event.registration))
        case .unregister:
            changes.append(
                .unregister(
                    TokenRemoval(
                        user: event.registration.user, token: event.registration.token,
                        unlessRegisteredAfter: event.registration.registeredAt, activity: event.registration.activity)))
        }
    }

    /// Applies the changes in their order, consecutive ones of a kind in one round trip (a batch of logins, the
    /// usual case, is one); what became of each, in the same order.
    func apply(to cache: TokenCache) throws(RedisError) -> [CacheChange] {
        var results: [CacheChange] = []
        results.reserveCapacity(changes.count)
        var start = 0
        while start < changes.count {
            let registering = changes[start].isRegistration
            var end = start
            while end < changes.count && changes[end].isRegistration == registering { end += 1 }
            let run = changes[start..<end]
            if registering {
                results += try cache.register(run.compactMap { if case .register(let r) = $0 { r } else { nil } })
            } else {
                results += try cache.remove(run.compactMap { if case .unregister(let r) = $0 { r } else { nil } })
            }
            start = end
        }
        return results
    }
}
