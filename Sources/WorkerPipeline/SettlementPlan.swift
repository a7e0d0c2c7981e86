import Foundation

/// What a finished job publishes, what it takes out of the token cache, and when it may be acknowledged.
///
/// Events, retries and parked jobs must not be lost: the job is acknowledged only once the broker has taken every
/// one of them (`isSafe`); otherwise it stays unacknowledged and its publications are made again. A summary to a
/// `reply_to` queue that does not exist holds nothing up. Dead tokens leave the cache only once their events are
/// safe with the broker, so a crash repeats work and never loses an event.
struct SettlementPlan {
    /// The job's publications: its dead-token events, then its retry or its parked copy, then the parts that wait
    /// for users' hours, then its summary.
    let publications: [Publication]
    /// The index of its summary among them, if its sender asked for one and none went out before.
    let summary: Int?
    /// Cache entries to remove once the publications are safe: only an entry that still serves the job's topic in
    /// that environment goes (a token registered since for another kind or app is someone else's). A Live Activity's
    /// update token leaves its activity. Tokens sent directly have no user: they are left to the cleanup consumer's
    /// events.
    let removals: [TokenRemoval]
    /// The reason a parked job carries, if it is parked.
    let parkedReason: String?

    /// On a job parked after its last attempt: the device tokens still undelivered, at most this many.
    static let undeliveredListed = 100

    /// Whether a job publishes or removes anything (what `init` would plan): most jobs, their notifications all
    /// delivered and no `reply_to`, do neither, and are settled without a plan.
    static func isNeeded(for progress: JobProgress, retry: RetryPolicy.Decision) -> Bool {
        if !progress.dead.isEmpty || progress.window?.parts.isEmpty == false { return true }
        switch retry {
        case .retry, .park: return true
        case .none, .expire: break
        }
        return JobSummary.replyQueue(of: progress.delivery) != nil && !progress.summarySent
    }

    /// `retry`: the retry policy's decision for the job, already applied to it (expired notifications counted).
    init(_ progress: JobProgress, retry: RetryPolicy.Decision, defaultTopic: String?) {
        let job = progress.job
        let delivery = progress.delivery
        var publications = progress.dead.map { target, response in
            let event = DeadTokenEvent(
                token: target.token, user: target.user, topic: job.topic,
                environment: target.environment, status: response.status,
                reason: response.reason?.label ?? "", timestamp: response.timestamp, jobID: job.id)
            return Publication(destination: .deadTokens, body: event.json, properties: MessageProperties())
        }
        var parkedReason: String?
        switch retry {
        case .retry(let delay):
            publications.append(Self.retry(progress, after: delay))
        case .park where progress.isUnserved:
            // Parked with what is left to send, no more: sent again after the credential is back, it repeats nothing.
            let reason =
                "\(progress.retryable.count) of \(progress.notificationCount) notifications not sent: "
                + (progress.retryable.first { $0.label == JobProgress.unservedLabel }?.reason ?? "")
            publications.append(
                Self.parked(
                    progress, reason: reason,
                    body: job.retryBody(
                        targets: progress.retryable.map(\.target),
                        original: delivery.body)))
            parkedReason = reason
        case .park:
            let reason =
                "\(progress.retryable.count) of \(progress.notificationCount) notifications not delivered after "
                + "\(job.attempt) attempts: \(progress.retryable.first?.reason ?? "")"
            publications.append(Self.parked(progress, reason: reason, body: job.originalBody ?? delivery.body))
            parkedReason = reason
        case .none, .expire:
            break
        }
        let now = Date().timeIntervalSince1970
        publications += (progress.window?.parts ?? []).compactMap { Self.windowPart($0, of: delivery, now: now) }
        var summary: Int?
        if let replyTo = JobSummary.replyQueue(of: delivery), !progress.summarySent {
            summary = publications.count
            let retrying = if case .retry = retry { true } else { false }
            publications.append(
                JobSummary.publication(
                    to: replyTo, body: progress.summaryJSON(retrying: retrying), of: delivery, jobID: job.id))
        }
        self.removals = Self.removals(of: progress, defaultTopic: defaultTopic)
        self.publications = publications
        self.summary = summary
        self.parkedReason = parkedReason
    }

    /// The dead tokens to take out of the cache once the publications are safe.
    private static func removals(of progress: JobProgress, defaultTopic: String?) -> [TokenRemoval] {
        let matcher = TopicMatcher(topic: progress.job.topic, defaultTopic: defaultTopic)
        // A dead token without a user of a job that names a Live Activity leaves the activity if it is there (the
        // store removes only an entry that holds it, registered before APNs learned it died), whether the job
        // reached it through the activity or named it in its tokens.
        let activity = progress.job.activity
        return progress.dead.compactMap { target, response in
            if let user = target.user {
                return TokenRemoval(
                    user: user, token: target.token, unlessRegisteredAfter: response.timestamp,
                    onlyIfValueIn: matcher.cacheValues(in: target.environment))
            }
            guard let activity else { return nil }
            return TokenRemoval(
                user: "", token: target.token, unlessRegisteredAfter: response.timestamp,
                onlyIfValueIn: matcher.cacheValues(in: target.environment), activity: activity)
        }
    }

    /// Whether everything that must not be lost was taken (`outcomes`: this plan's, in order).
    func isSafe(_ outcomes: ArraySlice<PublicationOutcome>) -> Bool {
        zip(publications.indices, outcomes).allSatisfy { index, outcome in index == summary || outcome == .taken }
    }

    /// Whether the summary went missing (no queue by its reply_to): worth a warning, nothing more.
    func summaryLost(_ outcomes: ArraySlice<PublicationOutcome>) -> Bool {
        guard let summary else { return false }
        return outcomes[outcomes.startIndex + summary] != .taken
    }

    /// Another attempt waits in a delay queue that dead-letters back to the queue of the job's lane: nothing is held
    /// here, and the retry survives this worker.
    private static func retry(_ progress: JobProgress, after delay: Double) -> Publication {
        var properties = progress.delivery.properties
        properties.persistent = true
        // The retry's wait in its lane is the delay it was given, not a queue falling behind.
        properties.timestamp = nil
        properties.headers[Worker.reasonHeader] = progress.retryable.first?.reason
        // A retry of a part is its own job, not the part (whose copies `claimWindowParts` recognises).
        properties.headers[Worker.windowPartHeader] = nil
        return Publication(
            destination: .retry(delay: delay, lane: progress.delivery.lane),
            body: progress.job.retryBody(
                targets: progress.retryable.map(\.target),
                original: progress.delivery.body),
            properties: properties)
    }

    /// Users (and tokens) that wait for their hours: the job as enqueued with only them, due at their window's opening
    /// (`send_at`), in the delay queue of the longest tier that does not pass it, as a scheduled job waits.
    private static func windowPart(_ part: WindowSplit.Part, of delivery: JobDelivery, now: Double) -> Publication? {
        guard
            let body = WindowSplit.partBody(delivery.body, users: part.users, tokens: part.tokens, sendAt: part.opensAt)
        else { return nil }
        var properties = delivery.properties
        properties.persistent = true
        properties.timestamp = nil
        properties.headers[Worker.republishedHeader] = nil
        properties.headers[StoreWaits.header] = nil
        properties.headers[Worker.windowPartHeader] = part.name
        return Publication(
            destination: .retry(
                delay: JobSchedule.delay(forRemaining: Double(part.opensAt) - now),
                lane: delivery.lane),
            body: body, properties: properties)
    }

    /// Parked (as its sender enqueued it, or what is left of it), with what happened in headers.
    private static func parked(_ progress: JobProgress, reason: String, body: [UInt8]) -> Publication {
        var properties = progress.delivery.properties
        properties.persistent = true
        properties.headers[Worker.reasonHeader] = reason
        properties.headers[Worker.attemptsHeader] = String(progress.job.attempt)
        properties.headers[Worker.undeliveredHeader] = progress.retryable.prefix(undeliveredListed)
            .map(\.target.token).joined(separator: ",")
        return Publication(destination: .failed, body: body, properties: properties)
    }
}
