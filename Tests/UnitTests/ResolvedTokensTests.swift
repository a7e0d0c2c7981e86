import Testing
import WorkerPipeline

@Suite struct ResolvedTokensTests {
    static func cached(_ number: Int) -> CachedToken {
        CachedToken(token: String(format: "%064x", number), scope: TokenScope(environment: .production))
    }

    /// Names that share their first, middle or last bytes, or differ in length only, are told apart; a name asked
    /// for twice is one entry.
    @Test func everyNameFindsItsOwnTokensAndANameAskedForTwiceIsOneEntry() {
        let names =
            (0..<3000).map { "user-\($0)" } + ["", "a", "ab", "abcdefgh", "abcdefghi", "abcdefgh\0", "ßüé-user"]
        var builder = ResolvedTokens.Builder(capacity: names.count * 2)
        let indices = names.map { builder.add($0) }
        #expect(zip(indices, names.indices).allSatisfy { $0 == $1 }, "each new name at the next index")
        #expect(names.allSatisfy { builder.add($0) == nil }, "each name once")
        #expect(builder.uniqueNames.elementsEqual(names))
        for index in names.indices {
            builder.markRead(index)
            for extra in 0..<(index % 3) { builder.append(Self.cached(index * 10 + extra), to: index) }
        }
        let resolved = builder.build()
        for (index, name) in names.enumerated() {
            #expect(resolved[name].map(Array.init) == (0..<(index % 3)).map { Self.cached(index * 10 + $0) }, "\(name)")
        }
        #expect(resolved["user-3000"] == nil)
        #expect(resolved["abcdefg"] == nil)
    }

    /// Tokens read out of their entries' order still land with their entries; an entry read and empty has none ([]),
    /// one never read whole (a failed read, a node that did not answer) has nil.
    @Test func tokensReadInAnyOrderLandWithTheirEntriesAndOnlyReadEntriesHaveAny() {
        var builder = ResolvedTokens.Builder(capacity: 4)
        for name in ["alice", "bob", "carol", "dana", "erin"] { _ = builder.add(name) }
        builder.append(Self.cached(21), to: 2)
        builder.append(Self.cached(1), to: 0)
        builder.append(Self.cached(22), to: 2)
        builder.append(Self.cached(2), to: 0)
        builder.append(Self.cached(31), to: 3)
        for read in [0, 1, 2, 4] { builder.markRead(read) }
        let resolved = builder.build()
        #expect(resolved["alice"].map(Array.init) == [Self.cached(1), Self.cached(2)])
        #expect(resolved["bob"].map(Array.init) == [])
        #expect(resolved["carol"].map(Array.init) == [Self.cached(21), Self.cached(22)])
        #expect(resolved["dana"] == nil, "never marked read: its token is not kept")
        #expect(resolved["erin"].map(Array.init) == [])
    }

    /// Names are told apart by their bytes, as Redis keys are: é precomposed and decomposed are two entries, in the
    /// table and in the dictionary a flood of colliding names moves it to (forced here by allowing no probe at all).
    @Test func namesAreToldApartByTheirBytesInTheTableAndInItsDictionary() {
        let precomposed = "ren\u{E9}e"
        let decomposed = "rene\u{301}e"
        #expect(precomposed == decomposed, "one text to Swift's ==")
        // The two spellings first: in the table when it moves, as a batch's names are (room for four times as many
        // names keeps the table that does not move from moving by chance).
        for longestProbe in [ResolvedTokens.Builder.defaultLongestProbe, 0] {
            let names = [precomposed, decomposed] + (0..<500).map { "user-\($0)" }
            var builder = ResolvedTokens.Builder(capacity: names.count * 4, longestProbe: longestProbe)
            #expect(names.allSatisfy { builder.add($0) != nil }, "each spelling is a name of its own")
            #expect(builder.add(decomposed) == nil && builder.add(precomposed) == nil)
            #expect(builder.namesInDictionary == (longestProbe == 0))
            for index in names.indices {
                builder.markRead(index)
                builder.append(Self.cached(index), to: index)
            }
            let resolved = builder.build()
            for (index, name) in names.enumerated() {
                #expect(resolved[name].map(Array.init) == [Self.cached(index)], "\(longestProbe): \(name)")
            }
        }
    }

    @Test func aDictionaryOrNothingMakesTheSameLookups() {
        let resolved = ResolvedTokens(["alice": [Self.cached(1)], "bob": []])
        #expect(resolved["alice"].map(Array.init) == [Self.cached(1)])
        #expect(resolved["bob"].map(Array.init) == [])
        #expect(resolved["carol"] == nil)
        let empty: ResolvedTokens = [:]
        #expect(empty["alice"] == nil)
    }
}
