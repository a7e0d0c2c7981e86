import AMQP
import AMQPBroker
import APNsModel
import Configuration
import Foundation
import JSON
import Redis
import RedisStore
import Telemetry
import WorkerPipeline

/// `apns-worker stats`: the state of the whole system from the broker (queue depths and consumers) and Redis (what
/// all workers did in the last minutes, which workers are alive).
public struct StatsReport: Sendable {
    public struct Queue: Sendable {
        public var role: String
        public var name: String
        /// nil: the queue does not exist (yet).
        public var messages: Int?
        public var consumers: Int?
    }

    /// One lane: its queue, and what the workers took from it and sent in the window.
    public struct Lane: Sendable {
        public var lane: JobLane
        public var queue: Queue
        public var jobsTaken: Int
        public var sent: Int
        /// The longest a job taken in the window had waited in the queue (ms; from the jobs' timestamps, which
        /// `enqueue` sets); nil when no timed job was taken.
        public var longestWaitMilliseconds: Int?
    }

    public var lanes: [Lane]
    public var queues: [Queue]
    /// Counter name -> total over the window, all workers together (names as in `SharedStatistics`).
    public var totals: [String: Int]
    /// The same per unix minute (what `rates(since:)` compares between two reports).
    public var minuteTotals: [Int64: [String: Int]] = [:]
    public var windowMinutes: Int
    public var workers: [String]
    /// The mass-invalidation guard's window across the fleet (nil: unreadable), and the guard it is weighed by.
    public var invalidationWindow: FleetInvalidationCounts?
    public var invalidationGuard: MassInvalidationGuard

    /// Whether the workers hold 400 mismatches back now (an unreadable window holds them back too).
    public var guardTripped: Bool { invalidationWindow.map(invalidationGuard.holdsBack) ?? true }

    public static func collect(_ configuration: WorkerConfiguration, windowMinutes: Int) throws -> StatsReport {
        let amqp = try configuration.broker.nodes.connect(heartbeat: 0, caFile: configuration.broker.caFile)
        defer { amqp.close() }
        let queueNames = configuration.broker.queues
        var names: [(String, String)] = [("urgent jobs", queueNames.jobs), ("bulk jobs", queueNames.bulk)]
        for lane in JobLane.allCases {
            names += configuration.broker.retryDelays.map { delay in
                (
                    "\(lane.rawValue) retry \(delay.formatted(.number.precision(.fractionLength(0...3)))) s",
                    queueNames.retry(delay: delay, lane: lane)
                )
            }
        }
        names += [
            ("dead tokens", queueNames.deadTokens), ("failed", queueNames.failed),
            ("registrations", queueNames.registrations)
        ]
        var queues: [Queue] = []
        for (role, name) in names {
            let status = try amqp.queueStatus(name)
            queues.append(Queue(role: role, name: name, messages: status?.messages, consumers: status?.consumers))
        }
        queues += try JobLane.allCases.map { lane in
            try scheduleTiers(of: lane, on: amqp, configuration.broker.retryDelays, queueNames)
        }
        let redis = try configuration.redis.connect()
        let shared = try SharedStatistics(redis: redis).read(minutes: windowMinutes)
        let lanes = JobLane.allCases.enumerated().map { position, lane in
            Lane(
                lane: lane, queue: queues[position], jobsTaken: shared.totals["\(lane.rawValue)_jobs"] ?? 0,
                sent: shared.totals["\(lane.rawValue)_sent"] ?? 0, longestWaitMilliseconds: shared.longestWait[lane])
        }
        return StatsReport(
            lanes: lanes, queues: queues, totals: shared.totals, minuteTotals: shared.perMinute,
            windowMinutes: windowMinutes, workers: shared.workers.sorted(),
            invalidationWindow: try SharedInvalidationWindow(redis: redis).totals(),
            invalidationGuard: configuration.pipeline.invalidationGuard)
    }

    /// A lane's delay queues other than its retry tiers, as one row: the tiers jobs wait in for their `send_at` (and
    /// copies waiting for Redis, in the shortest), their messages added up (nil when none of them exists).
    private static func scheduleTiers(
        of lane: JobLane, on amqp: AMQPConnection, _ retryDelays: [Double], _ names: QueueNames
    ) throws -> Queue {
        let retryMilliseconds = Set(retryDelays.map { Int(($0 * 1000).rounded()) })
        let tiers = JobSchedule.tiers.filter { !retryMilliseconds.contains(Int(($0 * 1000).rounded())) }
        var messages: Int?
        for tier in tiers {
            if let status = try amqp.queueStatus(names.retry(delay: tier, lane: lane)) {
                messages = (messages ?? 0) + status.messages
            }
        }
        let first = Int((tiers.first! * 1000).rounded())
        let last = Int((tiers.last! * 1000).rounded())
        return Queue(
            role: "\(lane.rawValue) scheduled, \(tiers.count) tiers",
            name: "\(names.jobs(lane)).retry.{\(first)..\(last)}ms", messages: messages, consumers: nil)
    }

    public var text: String {
        let seconds = Double(windowMinutes * 60)
        func column(_ text: String, _ width: Int) -> String {
            String(repeating: " ", count: max(0, width - text.count)) + text
        }
        var lines = [
            "LANE     QUEUE                     MESSAGES  CONSUMERS    JOBS/S    SENT/S  LONGEST WAIT (last \(windowMinutes) min)"
        ]
        for lane in lanes {
            // Timestamps are whole seconds (AMQP): a wait under a second cannot be told more finely.
            let wait = lane.longestWaitMilliseconds.map { $0 < 1000 ? "<1 s" : "\($0 / 1000) s" } ?? "-"
            lines.append(
                lane.lane.rawValue.padding(toLength: 8, withPad: " ", startingAt: 0) + " "
                    + lane.queue.name.padding(toLength: 24, withPad: " ", startingAt: 0) + " "
                    + column(lane.queue.messages.map(String.init) ?? "absent", 9) + "  "
                    + column(lane.queue.consumers.map(String.init) ?? "-", 9) + " "
                    + column(String(format: "%.1f", Double(lane.jobsTaken) / seconds), 9) + " "
                    + column(String(format: "%.1f", Double(lane.sent) / seconds), 9) + "  " + wait)
        }
        lines.append("")
        lines.append("QUEUE".padding(toLength: 56, withPad: " ", startingAt: 0) + " MESSAGES  CONSUMERS")
        for queue in queues {
            let label = "\(queue.name) (\(queue.role))"
            let messages = queue.messages.map(String.init) ?? "absent"
            let consumers = queue.consumers.map(String.init) ?? "-"
            lines.append(
                label.padding(toLength: 56, withPad: " ", startingAt: 0) + " "
                    + String(repeating: " ", count: max(0, 8 - messages.count)) + messages + "  "
                    + String(repeating: " ", count: max(0, 9 - consumers.count)) + consumers)
        }
        lines.append("")
        lines.append("LAST \(windowMinutes) MIN (all workers)        TOTAL     PER SECOND")
        for name in WorkerStatistics.Snapshot.fieldNames {
            let total = totals[name] ?? 0
            lines.append(
                name.padding(toLength: 30, withPad: " ", startingAt: 0)
                    + String(repeating: " ", count: max(0, 10 - String(total).count)) + String(total)
                    + String(format: "  %9.1f", Double(total) / seconds))
        }
        lines.append("")
        lines.append("INVALIDATION GUARD (all workers, last minute and last hour): " + guardLine)
        lines.append("")
        lines.append("WORKERS ALIVE (reported in the last 30 s): \(workers.count)")
        for worker in workers { lines.append("  \(worker)") }
        return lines.joined(separator: "\n")
    }

    public var json: String {
        let laneText = lanes.map { lane in
            "{\"lane\":\"\(lane.lane.rawValue)\",\"queue\":\(JSONString.quote(lane.queue.name)),"
                + "\"messages\":\(lane.queue.messages.map(String.init) ?? "null"),"
                + "\"consumers\":\(lane.queue.consumers.map(String.init) ?? "null"),"
                + "\"jobs_taken\":\(lane.jobsTaken),\"sent\":\(lane.sent),"
                + "\"longest_wait_ms\":\(lane.longestWaitMilliseconds.map(String.init) ?? "null")}"
        }.joined(separator: ",")
        let queueText = queues.map { queue in
            "{\"role\":\(JSONString.quote(queue.role)),\"name\":\(JSONString.quote(queue.name)),"
                + "\"messages\":\(queue.messages.map(String.init) ?? "null"),"
                + "\"consumers\":\(queue.consumers.map(String.init) ?? "null")}"
        }.joined(separator: ",")
        let totalText = WorkerStatistics.Snapshot.fieldNames.map { "\(JSONString.quote($0)):\(totals[$0] ?? 0)" }
            .joined(separator: ",")
        let workerText = workers.map(JSONString.quote).joined(separator: ",")
        func counts(_ counts: InvalidationCounts?) -> String {
            counts.map { "{\"mismatches\":\($0.mismatches),\"judged\":\($0.judged)}" } ?? "null"
        }
        let guardText =
            "{\"tripped\":\(guardTripped),\"window_seconds\":\(SharedInvalidationWindow.seconds),"
            + "\"window\":\(counts(invalidationWindow?.lastMinute)),"
            + "\"hour_window_seconds\":\(SharedInvalidationWindow.minutes * 60),"
            + "\"hour_window\":\(counts(invalidationWindow?.lastHour)),"
            + "\"threshold\":\(invalidationGuard.threshold),\"share\":\(invalidationGuard.share)}"
        return
            "{\"lanes\":[\(laneText)],\"queues\":[\(queueText)],\"window_minutes\":\(windowMinutes),\"totals\":{\(totalText)},"
            + "\"workers\":[\(workerText)],\"invalidation_guard\":\(guardText)}"
    }

    /// Per second, what all workers added between `earlier` and this report, `seconds` apart: per counter, the
    /// growth of every minute this report read (a minute `earlier` had not seen yet counts from zero). Workers
    /// report every 5 s, so rates over a shorter interval jump.
    public func rates(since earlier: StatsReport, seconds: Double) -> [String: Double] {
        var rates: [String: Double] = [:]
        for (minute, counts) in minuteTotals {
            for (name, count) in counts {
                let before = earlier.minuteTotals[minute]?[name] ?? 0
                rates[name, default: 0] += Double(max(0, count - before)) / max(seconds, 0.001)
            }
        }
        return rates
    }

    /// One frame of `stats --watch`: the time, the rates since the previous frame (nil: the first frame), then the
    /// report.
    public func watchFrame(at time: Date, rates: [String: Double]?, interval: Double) -> String {
        var lines = [
            "apns-worker stats at \(time.formatted(.iso8601)), every \(Self.format(interval)) s (Ctrl-C to stop)"
        ]
        if let rates {
            let shown = WorkerStatistics.Snapshot.fieldNames.map { name in
                "\(name) \(String(format: "%.1f", rates[name] ?? 0))/s"
            }
            lines.append(
                "NOW (all workers, last \(Self.format(interval)) s): " + shown.prefix(6).joined(separator: "  "))
            lines.append("    " + shown.dropFirst(6).joined(separator: "  "))
        } else {
            lines.append("NOW (all workers): rates from the next frame on")
        }
        lines.append("")
        return (lines + [text]).joined(separator: "\n")
    }

    /// One frame of `stats --watch --json`: the time, the rates since the previous frame (null on the first), and
    /// the report, on one line.
    public func watchJSON(at time: Date, rates: [String: Double]?) -> String {
        let rateText =
            rates.map { rates in
                "{"
                    + WorkerStatistics.Snapshot.fieldNames.map { name in
                        "\(JSONString.quote(name)):" + String(format: "%.3f", rates[name] ?? 0)
                    }.joined(separator: ",") + "}"
            } ?? "null"
        return
            "{\"at\":\(JSONString.quote(time.formatted(.iso8601))),\"rates_per_second\":\(rateText),\"report\":\(json)}"
    }

    private static func format(_ seconds: Double) -> String {
        seconds.formatted(.number.precision(.fractionLength(0...1)))
    }

    /// The guard's state in one line: what the window holds, what trips it, and whether it holds 400s back now.
    private var guardLine: String {
        let rule =
            "trips at \(invalidationGuard.threshold) or more over \(Int((invalidationGuard.share * 100).rounded()))%"
        guard let window = invalidationWindow else {
            return "window unreadable (a key of the wrong type among the guard's buckets): 400s held back"
        }
        let state =
            guardTripped
            ? "TRIPPED: no worker removes tokens for 400 BadDeviceToken/DeviceTokenNotForTopic"
            : "not tripped"
        let (minute, hour) = (window.lastMinute, window.lastHour)
        return "\(minute.mismatches) 400 mismatches of \(minute.judged) token-judging answers in the last minute, "
            + "\(hour.mismatches) of \(hour.judged) in the last hour (\(rule), in either): \(state)"
    }

}
