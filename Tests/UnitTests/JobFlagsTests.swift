import APNs
import Configuration
import Foundation
import HTTP2
import Operations
import Telemetry
import Testing
import WorkerPipeline

/// `apns-worker enqueue --user ... --alert ...`: the job the flags describe, and what a flag's value cannot be.
@Suite struct JobFlagsTests {
    var alert: JobFlags {
        var flags = JobFlags()
        flags.users = ["alice"]
        flags.alert = "Your order shipped"
        return flags
    }

    /// `--payload` is one JSON object: text after it does not become members of the job (another token, another
    /// environment), and a `--title` it would drop is refused.
    @Test func thePayloadIsOneJSONObject() throws {
        var flags = JobFlags()
        flags.users = ["alice"]
        flags.payload = #"{"aps":{"alert":"hi"}}"#
        let job = try PushJob.decode(try flags.body(), defaultTopic: "com.example.app", fallbackID: "flags")
        #expect(job.payload == Array(#"{"aps":{"alert":"hi"}}"#.utf8) && job.tokens.isEmpty)
        let token = String(repeating: "74", count: 32)
        for payload in [
            #"{"aps":{"alert":"hi"}},"tokens":["\#(token)"],"environment":"sandbox""#, "", "[1]", #"{"a":1"#
        ] {
            flags.payload = payload
            #expect(throws: JobFlags.Problem.self, "\(payload)") { try flags.body() }
        }
        flags.payload = #"{"aps":{}}"#
        flags.title = "Hello"
        #expect(throws: JobFlags.Problem.self) { try flags.body() }
    }

    @Test func aDeadlineInSecondsIsTheJobsDeadline() throws {
        var flags = alert
        flags.deadline = "4102444800"
        let job = try PushJob.decode(try flags.body(), defaultTopic: "com.example.app", fallbackID: "flags")
        #expect(job.deadline == 4_102_444_800 && job.users == ["alice"])
    }

    /// Milliseconds are what many clocks give: the error names the flag, the unit it wants and the value in it.
    @Test func aDeadlineInMillisecondsNamesTheFlagAndItsUnit() {
        var flags = alert
        flags.deadline = "4102444800000"
        do {
            _ = try flags.body()
            Issue.record("a deadline in milliseconds was accepted")
        } catch {
            #expect(error.description.hasPrefix("--deadline wants UNIX seconds"), "\(error)")
            #expect(
                error.description.contains("milliseconds") && error.description.hasSuffix("--deadline 4102444800"),
                "\(error)")
        }
        flags.deadline = "-1"
        #expect(throws: JobFlags.Problem.self) { try flags.body() }
    }
}
