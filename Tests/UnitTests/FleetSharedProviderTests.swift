import APNs
import COpenSSL
import Foundation
import TLS
import Telemetry
import Testing
import Threads

/// A provider shared with a fleet (`FleetProviderTokens`): it takes the fleet's token, and an ExpiredProviderToken goes
/// to the fleet, whatever the token's age.
@Suite struct FleetSharedProviderTests {
    final class RecordingFleet: ProviderTokenFleet, @unchecked Sendable {
        let asked = Locked<[Int64]>([])
        let answer: Bool
        init(answer: Bool) { self.answer = answer }
        func replace(_ provider: APNsTokenProvider, rejectedIssuedAt issuedAt: Int64) -> Bool {
            asked.withLock { $0.append(issuedAt) }
            return answer
        }
    }

    @Test func theFleetsTokenIsUsedAndOnlyANewerOneReplacesIt() throws {
        let key = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        let provider = try APNsTokenProvider(key: key, keyID: "ABC123DEFG", teamID: "TEAM123456")
        let now = Int64(Date().timeIntervalSince1970)
        let fleetToken = try provider.makeToken(issuedAt: now - 60)
        provider.adopt(token: fleetToken, issuedAt: now - 60)
        #expect(
            try provider.authorization() == "bearer " + fleetToken, "no token of its own while the fleet's is fresh")
        provider.adopt(token: "older", issuedAt: now - 120)
        #expect(provider.currentIssuedAt == now - 60, "an older token never replaces a newer one")
    }

    @Test func anExpiredTokenIsTheFleetsToReplaceWhateverItsAge() throws {
        let key = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        let provider = try APNsTokenProvider(key: key, keyID: "ABC123DEFG", teamID: "TEAM123456")
        _ = try provider.authorization()
        let issuedAt = try #require(provider.currentIssuedAt)
        let fleet = RecordingFleet(answer: true)
        provider.share(with: fleet)
        // A minute old: alone, the provider would keep it (Apple's 20-minute rule); the fleet decides once for all.
        #expect(provider.invalidate())
        #expect(fleet.asked.withLock { $0 } == [issuedAt])
    }

    /// A refusal of a token replaced since (requests in flight when the first refusal replaced it) sends again with
    /// the new one, asking the fleet for nothing: asked, it would find the new token refused and hold it for 20 minutes.
    @Test func aRefusalOfATokenReplacedSinceUsesTheNewOne() throws {
        let key = try ES256Key(pem: try ES256Key.generatePrivateKeyPEM())
        let provider = try APNsTokenProvider(key: key, keyID: "ABC123DEFG", teamID: "TEAM123456")
        let fleet = RecordingFleet(answer: false)
        provider.share(with: fleet)
        let now = Int64(Date().timeIntervalSince1970)
        provider.adopt(token: try provider.makeToken(issuedAt: now), issuedAt: now)
        #expect(provider.invalidate(refused: now - 60))
        #expect(fleet.asked.withLock { $0 }.isEmpty)
        #expect(!provider.invalidate(refused: now), "the token in use: the fleet decides (here, no)")
        #expect(fleet.asked.withLock { $0 } == [now])
    }
}
