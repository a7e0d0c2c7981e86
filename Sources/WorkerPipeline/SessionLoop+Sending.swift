import APNsModel
import Foundation
import Telemetry

/// Handing queued notifications to the sender, within the in-flight windows and the shared rate limit.
extension SessionLoop {
    /// Hands up to `wanted` queued notifications of each lane to the sender, urgent first (fewer if the shared rate
    /// limit grants fewer); returns the lanes the rate limit held back, with the seconds until more may go.
    /// Notifications whose job's deadline has passed are settled as expired on the way, without a permit or a
    /// request.
    func send(_ wanted: LaneCounts) throws -> (lanes: [JobLane], wait: Double)? {
        let now = Date().timeIntervalSince1970
        var sending: [JobLane: [QueuedNotification]] = [:]
        for lane in JobLane.allCases where wanted[lane] > 0 {
            let taken = backlogs.withQueue(lane) { $0.take(upTo: wanted[lane], liveAt: now) }
            sending[lane] = taken.live
            if !taken.expired.isEmpty { worker.answers.settleExpired(taken.expired, lane: lane) }
        }
        if !rateGroupHolds.isEmpty { holdEntriesOfHeldGroups(&sending) }
        var limited: (lanes: [JobLane], wait: Double)?
        if let rateLimiter = session.rateLimiter {
            let asked = LaneCounts(urgent: sending[.urgent]?.count ?? 0, bulk: sending[.bulk]?.count ?? 0)
            guard asked.total > 0 else { return nil }
            let granted: LaneCounts
            (granted, limited) = try reserve(asked, from: rateLimiter)
            for lane in JobLane.allCases {
                guard let entries = sending[lane], granted[lane] < entries.count else { continue }
                backlogs.withQueue(lane) { $0.putBack(entries[granted[lane]...]) }
                sending[lane] = Array(entries.prefix(granted[lane]))
            }
        }
        // After the fleet-wide limit: a group asks only for what may go, so that no permit of its own is spent on a
        // notification the fleet's limit sends back.
        try reserveForRateGroups(&sending)
        for lane in JobLane.allCases {
            guard let entries = sending[lane], !entries.isEmpty else { continue }
            hand(entries, of: lane)
        }
        return limited
    }

    /// Entries of groups that wait for their window join their group's hold instead of going.
    func holdEntriesOfHeldGroups(_ sending: inout [JobLane: [QueuedNotification]]) {
        for (lane, entries) in sending {
            var going: [QueuedNotification] = []
            var held: [RateGroup: [QueuedNotification]] = [:]
            going.reserveCapacity(entries.count)
            for entry in entries {
                if let group = entry.progress.job.rateGroup, rateGroupHolds.isHeld(group) {
                    held[group, default: []].append(entry)
                } else {
                    going.append(entry)
                }
            }
            for (group, entries) in held { rateGroupHolds.join(entries, of: group, lane: lane) }
            sending[lane] = going
        }
    }

    /// Permits from each rate group's own shared limit (a credential's `rate_limit`) for its notifications among
    /// `sending`. What a group cannot send now is held out of its lane until the group's next window (`RateGroupHolds`),
    /// while the notifications of other groups, and of none, go on.
    func reserveForRateGroups(_ sending: inout [JobLane: [QueuedNotification]]) throws {
        guard rateGroupsSeen, let makeLimiter = session.groupRateLimiter else { return }
        var asked: [RateGroup: LaneCounts] = [:]
        for (lane, entries) in sending {
            for entry in entries {
                if let group = entry.progress.job.rateGroup { asked[group, default: LaneCounts()][lane] += 1 }
            }
        }
        guard !asked.isEmpty else { return }
        var granted: [RateGroup: LaneCounts] = [:]
        var opensAt: [RateGroup: Date] = [:]
        let now = Date()
        for (group, counts) in asked {
            let limiter = groupLimiters[group] ?? makeLimiter(group)
            groupLimiters[group] = limiter
            let (got, short) = try reserve(counts, from: limiter)
            granted[group] = got
            if let short { opensAt[group] = now.addingTimeInterval(short.wait) }
        }
        guard !opensAt.isEmpty else { return }
        for (lane, entries) in sending {
            var going: [QueuedNotification] = []
            var held: [RateGroup: [QueuedNotification]] = [:]
            going.reserveCapacity(entries.count)
            for entry in entries {
                guard let group = entry.progress.job.rateGroup, opensAt[group] != nil else {
                    going.append(entry)
                    continue
                }
                if granted[group, default: LaneCounts()][lane] > 0 {
                    granted[group, default: LaneCounts()][lane] -= 1
                    going.append(entry)
                } else {
                    held[group, default: []].append(entry)
                }
            }
            for (group, entries) in held { rateGroupHolds.hold(entries, of: group, lane: lane, until: opensAt[group]!) }
            sending[lane] = going
        }
    }

    /// The urgent notifications queued now, as many as the core allows, ahead of the rest of the turn.
    func sendUrgent() throws {
        let now = Date()
        let count = core.urgentToSend(
            queued: backlogs.counts.urgent, inFlight: statistics.inFlight.counts.urgent, now: now)
        guard count > 0, let limited = try send(LaneCounts(urgent: count)) else { return }
        core.handle(.rateLimited(limited.lanes, nextWindowIn: limited.wait, at: now))
    }

    /// Permits for what is asked, per lane, and the lanes held back with the seconds until the next window.
    func reserve(_ asked: LaneCounts, from rateLimiter: any RateLimiter) throws
        -> (granted: LaneCounts, limited: (lanes: [JobLane], wait: Double)?)
    {
        let reservation = try rateLimiter.reserve(urgent: asked.urgent, bulk: asked.bulk)
        switch reservation {
        case .granted(let urgent, let bulk, let nextWindowIn):
            let short = reservation.lanesHeldBack(asked: asked)
            guard !short.isEmpty else { return (LaneCounts(urgent: urgent, bulk: bulk), nil) }
            statistics.rateLimitWaits.add(1, ordering: .relaxed)
            return (LaneCounts(urgent: urgent, bulk: bulk), (short, nextWindowIn))
        case .refused(let message):
            // The store refused the reservation (a slot key of the wrong type): nothing goes out unmetered; the slot
            // keys expire within 10 s, so waiting a second and asking again is enough.
            statistics.countDataError("rate_limit")
            logger.error("Redis refused the rate-limit reservation; waiting", ["redis.error": message])
            return (LaneCounts(), (JobLane.allCases, 1))
        }
    }

    /// The notifications of `entries`: those of one job, which come together, share one message (`APNsNotification`
    /// copies then count two references each, not one per field).
    private static func notifications(of entries: [QueuedNotification]) -> [APNsNotification] {
        // The job's first notification is found where the array holds it, and its job by identity: a copy of either
        // (in an optional pair, as before) counted the job, the token and the shared box for every notification.
        var notifications: [APNsNotification] = []
        notifications.reserveCapacity(entries.count)
        var firstJob: ObjectIdentifier?
        var first = 0
        for entry in entries {
            if ObjectIdentifier(entry.progress) == firstJob {
                notifications.append(entry.progress.notification(Int(entry.index), sharingWith: notifications[first]))
            } else {
                firstJob = ObjectIdentifier(entry.progress)
                first = notifications.count
                notifications.append(entry.progress.notification(Int(entry.index)))
            }
        }
        return notifications
    }

    /// One hand-over of a lane's notifications to the sender; each answer is recorded on the lane's sender thread, and
    /// wakes this thread when the lane's notifications in flight fall to the core's `sendMoreAt`.
    func hand(_ entries: [QueuedNotification], of lane: JobLane) {
        progressTracker.sent(entries)
        let statistics = self.statistics
        let answers = worker.answers
        let wakeup = worker.wakeup
        let sendMoreAt = self.sendMoreAt
        statistics.inFlight.add(lane, entries.count)
        let handedOver = DispatchTime.now().uptimeNanoseconds
        let latency = statistics.latency(lane)
        let handed = worker.sender.send(Self.notifications(of: entries), lane: lane) {
            position, result in
            latency.observe(nanoseconds: DispatchTime.now().uptimeNanoseconds &- handedOver)
            if statistics.inFlight.add(lane, -1) == sendMoreAt[lane] { wakeup.signal() }
            let entry = entries[position]
            answers.record(result, for: entry.progress, Int(entry.index))
        }
        // What went to APNs: a notification answered without a request (a broken rule, no credential for its topic)
        // was not sent.
        statistics.sent.add(lane, handed)
    }
}
