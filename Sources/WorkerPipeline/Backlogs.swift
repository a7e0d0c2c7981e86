/// Notifications waiting to be sent, first in first out, as (job, index) pairs: 16 bytes each, whatever the payload.
struct OutgoingQueue {
    private var entries: [(progress: JobProgress, index: Int32)] = []
    private var head = 0

    var count: Int { entries.count - head }
    var isEmpty: Bool { head == entries.count }

    mutating func append(_ progress: JobProgress, count: Int) {
        // No reserveCapacity: appending grows the storage geometrically, whereas reserving just what each job needed
        // copied the whole queue on every append (quadratic; with 500 fan-out jobs prefetched, nine page faults in
        // ten of the worker).
        for index in 0..<Int32(count) { entries.append((progress, index)) }
    }

    /// The next entries: up to `count` whose job's deadline (UNIX seconds) is later than `now`, and on the way every
    /// entry whose deadline has passed.
    mutating func take(upTo count: Int, liveAt now: Double)
        -> (live: [(progress: JobProgress, index: Int32)], expired: [(progress: JobProgress, index: Int32)]) {
        compact()
        var live: [(progress: JobProgress, index: Int32)] = []
        var expired: [(progress: JobProgress, index: Int32)] = []
        live.reserveCapacity(min(count, self.count))
        while live.count < count && head < entries.count {
            let entry = entries[head]
            head += 1
            if let deadline = entry.progress.job.deadline, Double(deadline) <= now {
                expired.append(entry)
            } else {
                live.append(entry)
            }
        }
        return (live, expired)
    }

    /// Entries just taken that could not go (the rate limit granted fewer) go back to the front, in their order.
    /// Only right after `take`: the slots before the head are still there until the next `take` compacts.
    mutating func putBack(_ returned: ArraySlice<(progress: JobProgress, index: Int32)>) {
        precondition(returned.count <= head, "putBack of more entries than were taken")
        head -= returned.count
        for (offset, entry) in returned.enumerated() { entries[head + offset] = entry }
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
