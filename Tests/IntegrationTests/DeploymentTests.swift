import Foundation
import Testing

/// The files in deploy/ are checked with the checkers this machine has: YAML parsed by Python's yaml module
/// (python3-yaml, installed by scripts/test), the systemd unit by `systemd-analyze verify`, the Dockerfile by its
/// structure (no container engine runs here).
@Suite struct DeploymentTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    struct CheckFailed: Error, CustomStringConvertible { let description: String }

    /// Runs a program to its end; its stdout, or an error with its stderr.
    static func run(_ executable: String, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let text = output.fileHandleForReading.readDataToEndOfFile()
        let errorText = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw CheckFailed(description: "\(executable) \(arguments.joined(separator: " ")): \(errorText)")
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// Every document of a YAML file, as Foundation objects (via JSON).
    static func yamlDocuments(_ path: String) throws -> [[String: Any]] {
        let json = try run(
            "/usr/bin/python3",
            [
                "-c",
                """
                import json, sys, yaml
                print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))
                """, root + "/" + path
            ])
        return try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]])
    }

    static func value(_ object: Any?, _ path: String) -> Any? {
        path.split(separator: ".").reduce(object) { current, key in
            if let index = Int(key), let array = current as? [Any] { return index < array.count ? array[index] : nil }
            return (current as? [String: Any])?[String(key)]
        }
    }

    @Test func theWorkerDeploymentHasProbesLimitsAGracePeriodAndTheKeyFromASecret() throws {
        let configMap = try #require(try Self.yamlDocuments("deploy/kubernetes/configmap.yaml").first)
        #expect(configMap["kind"] as? String == "ConfigMap")
        let settings = try #require(configMap["data"] as? [String: String])
        let deployment = try #require(try Self.yamlDocuments("deploy/kubernetes/deployment.yaml").first)
        #expect(deployment["kind"] as? String == "Deployment" && deployment["apiVersion"] as? String == "apps/v1")
        let pod = Self.value(deployment, "spec.template.spec")
        let container = Self.value(pod, "containers.0")
        #expect(Self.value(container, "livenessProbe.httpGet.path") as? String == "/healthz")
        #expect(Self.value(container, "readinessProbe.httpGet.path") as? String == "/readyz")
        #expect(Self.value(container, "ports.0.containerPort") as? Int == Int(settings["METRICS_PORT"] ?? ""))
        for field in ["requests.cpu", "requests.memory", "limits.cpu", "limits.memory"] {
            #expect(Self.value(container, "resources." + field) != nil, "resources.\(field)")
        }
        let grace = try #require(Self.value(pod, "terminationGracePeriodSeconds") as? Int)
        let drain = try #require(Int(settings["SHUTDOWN_TIMEOUT"] ?? ""))
        #expect(grace > drain, "the drain (\(drain) s) ends before SIGKILL (\(grace) s)")
        #expect(Self.value(pod, "securityContext.runAsNonRoot") as? Bool == true)
        #expect(Self.value(container, "securityContext.readOnlyRootFilesystem") as? Bool == true)

        // The key file the ConfigMap names is where the Secret volume puts it, readable by its owner only.
        let keyFile = try #require(settings["APNS_KEY_FILE"])
        let mount = try #require(Self.value(container, "volumeMounts.0") as? [String: Any])
        let volume = try #require(Self.value(pod, "volumes.0") as? [String: Any])
        #expect(mount["name"] as? String == volume["name"] as? String)
        let item = try #require(Self.value(volume, "secret.items.0") as? [String: Any])
        #expect("\(mount["mountPath"] as? String ?? "")/\(item["path"] as? String ?? "")" == keyFile)
        #expect(Self.value(volume, "secret.defaultMode") as? Int == 0o400)
        let secretVariables = (Self.value(container, "env") as? [[String: Any]] ?? []).compactMap {
            $0["name"] as? String
        }
        #expect(Set(secretVariables) == ["AMQP_URL", "REDIS_URL"], "URLs with passwords come from the Secret")
        #expect(settings["AMQP_URL"] == nil && settings["REDIS_URL"] == nil, "no credentials in the ConfigMap")
    }

    @Test func kedaScalesTheWorkersOnBothLanesQueues() throws {
        let documents = try Self.yamlDocuments("deploy/kubernetes/keda-scaledobject.yaml")
        let settings = try #require(
            Self.value(try Self.yamlDocuments("deploy/kubernetes/configmap.yaml").first, "data")
                as? [String: String])
        let scaled = try #require(documents.first { $0["kind"] as? String == "ScaledObject" })
        #expect(Self.value(scaled, "spec.scaleTargetRef.name") as? String == "apns-worker")
        #expect(Self.value(scaled, "spec.triggers.0.type") as? String == "rabbitmq")
        #expect(Self.value(scaled, "spec.triggers.0.metadata.queueName") as? String == settings["PUSH_JOBS_QUEUE"])
        #expect(
            Self.value(scaled, "spec.triggers.1.metadata.queueName") as? String == settings["PUSH_BULK_QUEUE"],
            "the bulk lane's backlog scales the fleet too")
        let authentication = try #require(documents.first { $0["kind"] as? String == "TriggerAuthentication" })
        #expect(
            Self.value(scaled, "spec.triggers.0.authenticationRef.name") as? String
                == Self.value(authentication, "metadata.name") as? String)
        let kustomization = try #require(try Self.yamlDocuments("deploy/kubernetes/kustomization.yaml").first)
        let resources = try #require(kustomization["resources"] as? [String])
        for resource in resources {
            #expect(FileManager.default.fileExists(atPath: Self.root + "/deploy/kubernetes/" + resource), "\(resource)")
        }
        let cleanup = try #require(try Self.yamlDocuments("deploy/kubernetes/cleanup-deployment.yaml").first)
        #expect(Self.value(cleanup, "spec.template.spec.containers.0.args") as? [String] == ["cleanup"])
        let secret = try #require(try Self.yamlDocuments("deploy/kubernetes/secret.example.yaml").first)
        #expect(
            (Self.value(secret, "stringData") as? [String: Any])?.keys.sorted() == [
                "AMQP_URL", "AuthKey.p8", "REDIS_URL"
            ])
    }

    @Test func theComposeFileRunsTheWholeSystem() throws {
        let compose = try #require(try Self.yamlDocuments("deploy/compose.yaml").first)
        let services = try #require(compose["services"] as? [String: Any])
        for name in ["rabbitmq", "redis", "apns-sim", "apns-worker", "apns-cleanup"] {
            #expect(services[name] != nil, "service \(name)")
        }
        let worker = Self.value(services, "apns-worker")
        #expect(Self.value(worker, "environment.APNS_PRODUCTION_URL") as? String == "https://apns-sim:2197")
        let simulator = try #require(Self.value(services, "apns-sim.command") as? [String])
        #expect(
            simulator.contains("--cert-host") && simulator.contains("apns-sim"), "the certificate fits the host name")
        #expect(Self.value(worker, "depends_on.rabbitmq.condition") as? String == "service_healthy")
    }

    @Test func theDockerfileBuildsInOneStageAndRunsUnprivilegedInAnother() throws {
        let text = try String(contentsOfFile: Self.root + "/deploy/Dockerfile", encoding: .utf8)
        let lines = text.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }.filter {
            !$0.hasPrefix("#")
        }
        let stages = lines.filter { $0.hasPrefix("FROM ") }
        #expect(stages.count == 2 && stages[0].hasSuffix("AS build"), "\(stages)")
        let runtime = lines.drop { !($0.hasPrefix("FROM ") && !$0.hasSuffix("AS build")) }
        let user = try #require(runtime.last { $0.hasPrefix("USER ") })
        #expect(!user.contains("root") && !user.hasPrefix("USER 0"), "\(user)")
        #expect(runtime.contains { $0.hasPrefix("COPY --from=build") })
        #expect(runtime.contains("ENTRYPOINT [\"/usr/local/bin/apns-worker\"]"))
        #expect(text.contains("--static-swift-stdlib"), "the runtime image carries no toolchain")
    }

    /// scripts/test installs systemd (for systemd-analyze): without it this fails, it never skips.
    @Test func theSystemdUnitVerifies() throws {
        // The unit names the installed paths; point them at this checkout so that verify can check them.
        let built = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path + "/apns-worker"
        let unit = try String(contentsOfFile: Self.root + "/deploy/apns-worker.service", encoding: .utf8)
            .replacingOccurrences(of: "/usr/local/bin/apns-worker", with: built)
            .replacingOccurrences(
                of: "EnvironmentFile=/etc/apns-worker/apns-worker.env",
                with: "EnvironmentFile=\(Self.root)/config/apns-worker.env")
        let directory = NSTemporaryDirectory() + "unit-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try unit.write(toFile: directory + "/apns-worker.service", atomically: true, encoding: .utf8)
        _ = try Self.run("/usr/bin/systemd-analyze", ["verify", directory + "/apns-worker.service"])
        #expect(unit.contains("TimeoutStopSec=35") && unit.contains("KillSignal=SIGTERM"), "room for the 25 s drain")
    }
}
