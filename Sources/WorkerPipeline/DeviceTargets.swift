import APNsModel

/// The device tokens one job (or one piece of a large job) reaches, by index: targets as the resolver made them, or,
/// for a job that reaches only the tokens it names itself, those tokens in the job's environment, each made a
/// `DeviceTarget` when it is read.
///
/// Why: most transactional jobs name one token of their own, and an array of targets made from the job's own array
/// of tokens was one more allocation, and one more freeing, for every such job.
public struct DeviceTargets: RandomAccessCollection, Sendable {
    // One word either way (the cases' payloads are references, the case in their spare bits): a job's progress, which
    // holds one, stays within the allocator's fast bins (`AllocationSizeTests`).
    private enum Storage: Sendable {
        case targets([DeviceTarget])
        /// A job that reaches its own tokens alone, each once: they are read from it.
        case ownTokens(of: PushJob)
    }
    private let storage: Storage

    public init(_ targets: [DeviceTarget]) {
        storage = .targets(targets)
    }

    /// `job`'s own tokens, in its environment, with no user; it must name each once and no user
    /// (`TargetResolver.deviceTargets(of:resolved:activityTokens:alreadySettled:)` sees to it).
    init(ownTokensOf job: PushJob) {
        storage = .ownTokens(of: job)
    }

    public var startIndex: Int { 0 }

    public var endIndex: Int {
        switch storage {
        case .targets(let targets): targets.count
        case .ownTokens(let job): job.tokens.count
        }
    }

    public subscript(index: Int) -> DeviceTarget {
        switch storage {
        case .targets(let targets): targets[index]
        case .ownTokens(let job): DeviceTarget(token: job.token(at: index), environment: job.environment, user: nil)
        }
    }
}
