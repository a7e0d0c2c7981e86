import APNsModel
import Foundation

/// A notification waiting to be sent: its job and its index among the job's targets, 16 bytes whatever the payload.
/// A struct, not a tuple: arrays of tuples were copied and destroyed through the runtime's generic value witnesses
/// (`tuple_destroy`), where a struct's are specialized to a reference count.
struct QueuedNotification {
    let progress: JobProgress
    let index: Int32
}

/// Notifications waiting to be sent, first in first out.
struct OutgoingQueue {
    private var entries: [QueuedNotification] = []
    private var head = 0

    var count: Int { entries.count - head }
    var isEmpty: Bool { head == entries.count }

    mutating func append(_ progress: JobProgress, count: Int) {
        // No reserveCapacity: appending grows the storage geometrically, whereas reserving just what each job needed
        // copied the whole queue on every append (quadratic; with 500 fan-out jobs prefetched, nine page faults in
        // ten of the worker).
        for index in 0..<Int32(count) { entries.append(QueuedNotification(progress: progress, index: index)) }
    }

    /// The next entries: up to `count` whose job's deadline (UNIX seconds) is later than `now`, and on the way every
    /// entry whose deadline has passed.
    mutating func take(upTo count: Int, liveAt now: Double)
        -> (live: [QueuedNotification], expired: [QueuedNotification])
    {
        compact()
        var live: [QueuedNotification] = []
        var expired: [QueuedNotification] = []
        // All of it, none expired (the usual turn of single-token jobs): the storage itself is handed over, where a
        // copy counted every entry's job once more, and the compaction after it once less.
        if head == 0 && entries.count <= count && !entries.contains(where: { Self.hasExpired($0, at: now) }) {
            swap(&live, &entries)
            return (live, expired)
        }
        live.reserveCapacity(min(count, self.count))
        while live.count < count && head < entries.count {
            let entry = entries[head]
            head += 1
            if Self.hasExpired(entry, at: now) {
                expired.append(entry)
            } else {
                live.append(entry)
            }
        }
        return (live, expired)
    }

    private static func hasExpired(_ entry: QueuedNotification, at now: Double) -> Bool {
        guard let deadline = entry.progress.job.deadline else { return false }
        return Double(deadline) <= now
    }

    /// Takes every entry of the `cancelled` jobs out of the queue, keeping the others in their order.
    mutating func remove(jobsIn cancelled: Set<String>) -> [QueuedNotification] {
        guard !cancelled.isEmpty, !isEmpty else { return [] }
        let (kept, removed) = CancellationWatch.split(entries[head...], among: cancelled)
        guard !removed.isEmpty else { return [] }
        entries = kept
        head = 0
        return removed
    }

    /// Entries just taken that could not go (the rate limit granted fewer) go back to the front, in their order.
    /// Only right after `take`: the slots before the head are still there until the next `take` compacts, unless
    /// `take` handed over the whole storage (then they are put in again).
    mutating func putBack(_ returned: ArraySlice<QueuedNotification>) {
        guard returned.count <= head else {
            precondition(head == 0, "putBack of more entries than were taken")
            entries.insert(contentsOf: returned, at: 0)
            return
        }
        head -= returned.count
        for (offset, entry) in returned.enumerated() { entries[head + offset] = entry }
    }

    /// Entries held out of the queue for a while (a rate group's) go back to the front, in their order, at any time.
    mutating func prepend(_ returned: [QueuedNotification]) {
        if returned.count <= head {
            head -= returned.count
            for (offset, entry) in returned.enumerated() { entries[head + offset] = entry }
        } else {
            entries.replaceSubrange(head..<head, with: returned)
        }
    }

    /// Taken entries are dropped in bulk once they are half the storage, not one by one.
    private mutating func compact() {
        if head == entries.count {
            entries.removeAll(keepingCapacity: entries.count <= 65_536)
            head = 0
        } else if head >= entries.count / 2 {
            entries.removeFirst(head)
            head = 0
        }
    }
}

/// One outgoing queue per lane.
struct Backlogs {
    private var urgent = OutgoingQueue()
    private var bulk = OutgoingQueue()

    var counts: LaneCounts { LaneCounts(urgent: urgent.count, bulk: bulk.count) }

    /// Works on one lane's queue in place (no copy of its storage).
    mutating func withQueue<Result>(_ lane: JobLane, _ body: (inout OutgoingQueue) -> Result) -> Result {
        switch lane {
        case .urgent: body(&urgent)
        case .bulk: body(&bulk)
        }
    }
}

/// The notifications of rate groups (credentials with a `rate_limit` of their own) whose window is spent: out of
/// their lanes until the window opens, so that the lane goes on with every other group's notifications (the lane
/// itself waits only for the fleet-wide limit). Broker thread only.
struct RateGroupHolds {
    private struct Hold {
        var opensAt: Date
        var entries: [JobLane: [QueuedNotification]] = [:]
    }

    private var holds: [RateGroup: Hold] = [:]

    var isEmpty: Bool { holds.isEmpty }

    /// When the first held group's window opens.
    var nextOpening: Date? { holds.values.map(\.opensAt).min() }

    /// Whether `group` waits for its window now.
    func isHeld(_ group: RateGroup) -> Bool { holds[group] != nil }

    /// Holds `entries` of `group` (taken from `lane`) until its window opens at `opensAt`.
    mutating func hold(
        _ entries: [QueuedNotification], of group: RateGroup, lane: JobLane,
        until opensAt: Date
    ) {
        holds[group, default: Hold(opensAt: opensAt)].entries[lane, default: []] += entries
    }

    /// Adds `entries` of a group held now (`isHeld`) to its hold, behind what it holds already.
    mutating func join(_ entries: [QueuedNotification], of group: RateGroup, lane: JobLane) {
        holds[group]?.entries[lane, default: []] += entries
    }

    /// Takes every held entry of the `cancelled` jobs out, per lane.
    mutating func remove(jobsIn cancelled: Set<String>) -> [JobLane: [QueuedNotification]] {
        var removed: [JobLane: [QueuedNotification]] = [:]
        for group in Array(holds.keys) {
            for lane in JobLane.allCases {
                guard let entries = holds[group]?.entries[lane] else { continue }
                let (kept, dropped) = CancellationWatch.split(entries, among: cancelled)
                guard !dropped.isEmpty else { continue }
                removed[lane, default: []] += dropped
                holds[group]?.entries[lane] = kept
            }
        }
        return removed
    }

    /// Groups whose window has opened give their notifications back to the front of their lanes.
    mutating func release(dueAt now: Date, into backlogs: inout Backlogs) {
        for (group, hold) in holds where hold.opensAt <= now {
            for (lane, entries) in hold.entries { backlogs.withQueue(lane) { $0.prepend(entries) } }
            holds[group] = nil
        }
    }
}
