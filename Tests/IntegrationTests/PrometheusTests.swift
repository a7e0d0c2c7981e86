import AMQP
import APNs
import APNsSimulator
import Foundation
import Redis
import RedisStore
import Telemetry
import Testing

/// deploy/grafana/apns-worker.json and deploy/prometheus/apns-worker-rules.yaml against the real thing: Debian's
/// Prometheus scrapes two workers, cleanup and the broker's rabbitmq_prometheus plugin while jobs flow through
/// apns-sim (deliveries, dead tokens, throttled and bad tokens, a refused job), evaluates the rules, and answers
/// every panel's and every rule's expression through its HTTP API with at least one series carrying the labels the
/// panel's legend or the alert's text names. A metric renamed in the code leaves its expressions empty.
@Suite struct PrometheusTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    struct Failure: Error, CustomStringConvertible { let description: String }

    /// An instant query's series: each one's labels.
    static func query(port: Int, _ expression: String) throws -> [[String: String]] {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        let encoded = expression.addingPercentEncoding(withAllowedCharacters: allowed) ?? expression
        let body = try TestServices.httpGet(port: port, "/api/v1/query?query=\(encoded)", version: "1.0").body
        guard let answer = try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any],
            answer["status"] as? String == "success", let data = answer["data"] as? [String: Any]
        else {
            throw Failure(description: "Prometheus refused \(expression): \(body.prefix(500))")
        }
        return (data["result"] as? [[String: Any]] ?? []).map { ($0["metric"] as? [String: String]) ?? [:] }
    }

    /// The labels a text names: `{{lane}}` (a legend) or `{{ $labels.lane }}` (an alert's annotation).
    static func namedLabels(_ text: String) -> Set<String> {
        Set(text.matches(of: /\{\{\s*(?:\$labels\.)?([a-z_]+)\s*\}\}/).map { String($0.1) })
    }

    struct Expression {
        var origin: String
        var query: String
        var labels: Set<String>
    }

    /// Every panel target, with the dashboard's variables as an operator would leave them (all jobs and
    /// instances, the lanes' queues).
    static func dashboardExpressions(queues: String) throws -> [Expression] {
        let dashboard = try #require(
            try JSONSerialization.jsonObject(
                with: Data(contentsOf: URL(fileURLWithPath: root + "/deploy/grafana/apns-worker.json")))
                as? [String: Any])
        let panels = try #require(dashboard["panels"] as? [[String: Any]])
        return panels.flatMap { panel -> [Expression] in
            (panel["targets"] as? [[String: Any]] ?? []).map { target in
                let expr = (target["expr"] as? String ?? "").replacingOccurrences(of: "$__rate_interval", with: "1m")
                    .replacingOccurrences(of: "$job", with: ".+").replacingOccurrences(of: "$instance", with: ".+")
                    .replacingOccurrences(of: "$queues", with: queues)
                return Expression(
                    origin: "panel \"\(panel["title"] as? String ?? "?")\"", query: expr,
                    labels: namedLabels(target["legendFormat"] as? String ?? ""))
            }
        }
    }

    /// Every rule of the rules file (read by python3-yaml). A recording rule's expression as written, its labels
    /// from its name's level (`job_lane:` -> job, lane); an alert's with its comparisons made `bool`, so that it
    /// answers whether or not it fires, its labels from its annotations.
    /// The rules of a rules file, as read by python3-yaml.
    static func rules(_ rulesFile: String) throws -> [[String: Any]] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = [
            "-c", "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
            rulesFile
        ]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let file = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let groups = try #require(file["groups"] as? [[String: Any]])
        return groups.flatMap { ($0["rules"] as? [[String: Any]]) ?? [] }
    }

    static func ruleExpressions(_ rulesFile: String) throws -> [Expression] {
        return try rules(rulesFile).map { rule in
            let expr = rule["expr"] as? String ?? ""
            if let record = rule["record"] as? String {
                let level = record.split(separator: ":").first.map(String.init) ?? ""
                return Expression(
                    origin: "record \(record)", query: expr,
                    labels: Set(level.split(separator: "_").map(String.init)).intersection(["job", "lane", "instance"]))
            }
            let annotations = (rule["annotations"] as? [String: String] ?? [:]).values.joined(separator: " ")
            return Expression(
                origin: "alert \(rule["alert"] as? String ?? "?")",
                query: expr.replacing(/(\s)(==|!=|>=|<=|>|<)(\s)/) { "\($0.1)\($0.2) bool\($0.3)" },
                labels: namedLabels(annotations))
        }
    }

    /// The rules file as an operator deploys it: with the lanes' queue names of this deployment.
    static func deployedRules(queues: (jobs: String, bulk: String), directory: String) throws -> String {
        let shipped = try String(contentsOfFile: root + "/deploy/prometheus/apns-worker-rules.yaml", encoding: .utf8)
        let edited = shipped.replacingOccurrences(
            of: #"push\\.jobs|push\\.bulk"#, with: "\(queues.jobs)|\(queues.bulk)")
        #expect(edited != shipped, "the rules name the lanes' queues")
        let path = directory + "/apns-worker-rules.yaml"
        try edited.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// Debian's Prometheus on `port`, scraping every second the workers, cleanup and the test broker's
    /// rabbitmq_prometheus, and evaluating `rules` every second.
    static func startPrometheus(
        port: Int, workers: [Int], cleanup: Int, rules: String,
        directory: String
    ) throws -> TestServices.Daemon {
        let rabbitmqMetrics = try TestServices.value("RABBITMQ_PROMETHEUS_PORT")
        let configuration = """
            global: {scrape_interval: 1s, evaluation_interval: 1s}
            rule_files: ["\(rules)"]
            scrape_configs:
              - job_name: apns-worker
                static_configs: [{targets: [\(workers.map { "\"127.0.0.1:\($0)\"" }.joined(separator: ", "))]}]
              - job_name: apns-cleanup
                static_configs: [{targets: ["127.0.0.1:\(cleanup)"]}]
              - job_name: rabbitmq
                metrics_path: /metrics/detailed
                params: {family: [queue_coarse_metrics, queue_consumer_count]}
                static_configs: [{targets: ["127.0.0.1:\(rabbitmqMetrics)"]}]
            """
        try configuration.write(toFile: directory + "/prometheus.yml", atomically: true, encoding: .utf8)
        return try TestServices.Daemon(
            "/usr/bin/prometheus",
            [
                "--config.file=\(directory)/prometheus.yml", "--storage.tsdb.path=\(directory)/data",
                "--web.listen-address=127.0.0.1:\(port)"
            ])
    }

    /// docs/operations.md lists every alert of the rules file with its severity and its runbook line,
    /// word for word.
    @Test func theOperationsGuideListsEveryAlertWithItsSeverityAndRunbook() throws {
        let guide = try String(contentsOfFile: Self.root + "/docs/operations.md", encoding: .utf8).split(
            separator: "\n")
        let alerts = try Self.rules(Self.root + "/deploy/prometheus/apns-worker-rules.yaml").filter {
            $0["alert"] != nil
        }
        #expect(alerts.count >= 10)
        for alert in alerts {
            let name = alert["alert"] as? String ?? "?"
            let row = guide.first { $0.hasPrefix("| \(name) |") }
            let runbook = (alert["annotations"] as? [String: String])?["runbook"] ?? "?"
            let severity = (alert["labels"] as? [String: String])?["severity"] ?? "?"
            #expect(row?.contains(runbook) == true, "\(name): the guide's row carries the runbook line: \(runbook)")
            #expect(row?.contains("| \(severity) |") == true, "\(name): the guide's row says \(severity)")
        }
    }

    @Test func everyPanelAndRuleExpressionAnswersWithItsLabels() throws {
        let directory = NSTemporaryDirectory() + TestServices.unique("prometheus")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let live = String(repeating: "a1", count: 32)
        let dead = String(repeating: "d1", count: 32)
        let throttled = String(repeating: "c1", count: 32)
        let bad = String(repeating: "b1", count: 32)
        var behaviour = APNsSimulator.Behaviour()
        behaviour.badTokens = [bad]
        behaviour.throttledTokens = [throttled]
        let simulator = try APNsSimulator(
            configuration: .init(
                unregisteredTokens: [dead: 1_732_900_000_000],
                recordsNotifications: false, behaviour: behaviour),
            logger: Logger(label: "sim", level: .warning))
        defer { simulator.shutdown() }
        let (redisURL, redis) = try TestServices.isolatedRedis(.prometheus)
        let users = (0..<20).map { "user-\($0)" }
        for user in users {
            _ = try redis.command(["HSET", RedisKeys.node.tokens(user), live, "production", dead, "production"])
        }
        let jobs = TestServices.unique("jobs")
        var environment = try TestServices.workerEnvironment(
            simulator: simulator, jobs: jobs,
            [
                "REDIS_URL": redisURL, "METRICS_HOST": "127.0.0.1", "LOG_LEVEL": "warning",
                "PUSH_REGISTRATIONS_QUEUE": TestServices.unique("registrations"),
                "APNS_RETRY_DELAYS": "1", "APNS_MAX_ATTEMPTS": "2"
            ])
        let bulk = try #require(environment["PUSH_BULK_QUEUE"])
        let ports = (0..<3).map { _ in TestServices.freePort() }
        var programs: [ExecutablesTests.Child] = []
        defer { for program in programs { _ = program.stop(SIGKILL) } }
        for port in ports.prefix(2) {
            environment["METRICS_PORT"] = String(port)
            programs.append(try ExecutablesTests.Child("apns-worker", ["run"], environment: environment))
        }
        environment["METRICS_PORT"] = String(ports[2])
        programs.append(try ExecutablesTests.Child("apns-worker", ["cleanup"], environment: environment))
        for port in ports {
            #expect(
                TestServices.waitUntil(timeout: 60) {
                    (try? TestServices.httpGet(port: port, "/readyz").status) == 200
                },
                "the program on \(port) became ready")
        }

        let prometheusPort = TestServices.freePort()
        let rules = try Self.deployedRules(queues: (jobs, bulk), directory: directory)
        let prometheus = try Self.startPrometheus(
            port: prometheusPort, workers: Array(ports.prefix(2)),
            cleanup: ports[2], rules: rules, directory: directory)
        defer { prometheus.stop() }

        // Rates need samples from before the jobs: they flow once Prometheus scrapes every target.
        #expect(
            TestServices.waitUntil(timeout: 60) {
                ((try? Self.query(port: prometheusPort, "count_over_time(up[1m]) > 2 and up == 1")) ?? []).count == 4
            }, "Prometheus scrapes the two workers, cleanup and the broker")

        // Jobs on both lanes: delivered and dead tokens (users), a throttled token (retried, then parked), a bad
        // token (400), and a job the workers refuse.
        let publisher = try AMQPConnection(url: TestServices.amqpURL())
        for (queue, prefix) in [(jobs, "urgent"), (bulk, "bulk")] {
            try publisher.declareQueue(queue)
            for (index, user) in users.enumerated() {
                try publisher.publish(
                    to: queue,
                    body: Array(#"{"id": "\#(prefix)-\#(index)", "users": ["\#(user)"], "payload": {"aps": {}}}"#.utf8))
            }
            try publisher.publish(
                to: queue,
                body: Array(
                    #"{"id": "\#(prefix)-odd", "tokens": ["\#(throttled)", "\#(bad)", "\#(live)"], "payload": {"aps": {}}}"#
                        .utf8))
        }
        try publisher.publish(to: jobs, body: Array(#"{"users": ["u"], "push_type": "smoke", "payload": {}}"#.utf8))

        // Ready when Prometheus has scraped every target for a while and evaluated the rules over those samples.
        var seen = ""
        let scraped = TestServices.waitUntil(timeout: 90) {
            let up = (try? Self.query(port: prometheusPort, "count_over_time(up[1m]) > 5 and up == 1")) ?? []
            let latency =
                (try? Self.query(port: prometheusPort, "job_lane:apns_worker_latency_seconds:p99_5m > 0")) ?? []
            let parked =
                (try? Self.query(
                    port: prometheusPort, "sum(apns_worker_parked_jobs_total{reason=\"attempts_exhausted\"}) > 0"))
                ?? []
            seen =
                "targets up: \(up.compactMap { $0["instance"] }), latency recorded for: \(latency.compactMap { $0["lane"] }), "
                + "jobs parked after their attempts: \(!parked.isEmpty)"
            return up.count == 4 && Set(latency.compactMap { $0["lane"] }) == ["urgent", "bulk"] && !parked.isEmpty
        }
        #expect(scraped, "Prometheus scraped both workers, cleanup and the broker, and the jobs were answered: \(seen)")

        let expressions = try Self.dashboardExpressions(queues: "\(jobs)|\(bulk)") + Self.ruleExpressions(rules)
        #expect(expressions.count > 45, "every panel target and rule: \(expressions.count)")
        for expression in expressions {
            let series = try Self.query(port: prometheusPort, expression.query)
            #expect(!series.isEmpty, "\(expression.origin): no series for \(expression.query)")
            for labels in series {
                #expect(
                    expression.labels.isSubset(of: Set(labels.keys)),
                    "\(expression.origin): a series without \(expression.labels.subtracting(labels.keys)): \(labels)")
            }
        }
    }
}
