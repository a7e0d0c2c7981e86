/// How much bulk work a worker holds started at once. A bulk job, once started, holds its decoded users, what it
/// reached so far and its body until it settles; the bulk prefetch lets the broker hand over many more (a hundred
/// 100,000-user campaigns are a hundred 800 KB bodies). Jobs past the budget wait as delivered, undecoded, and start
/// as the ones under way settle: big jobs hold their share of memory, not the prefetch's. One job always runs, however
/// large, so that no job waits for ever.
public struct BulkAdmission: Sendable, Equatable {
    /// Bytes of the bodies of the large bulk jobs under way.
    public var maximumBytes: Int
    /// Users and tokens of the large bulk jobs under way.
    public var maximumTargets: Int

    public init(maximumBytes: Int = 4 << 20, maximumTargets: Int = 200_000) {
        self.maximumBytes = maximumBytes
        self.maximumTargets = maximumTargets
    }

    /// Whether another bulk job may start beside what is under way.
    public func admits(bytesUnderWay: Int, targetsUnderWay: Int) -> Bool {
        (bytesUnderWay == 0 && targetsUnderWay == 0)
            || (bytesUnderWay < maximumBytes && targetsUnderWay < maximumTargets)
    }
}
