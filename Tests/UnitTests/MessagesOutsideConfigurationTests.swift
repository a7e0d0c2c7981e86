import APNs
import Configuration
import Foundation
import HTTP2
import Operations
import Telemetry
import Testing
import WorkerPipeline

/// Messages of the modules below Configuration speak their own words; where an operator needs the setting's name,
/// the configuration layer names it.
@Suite struct MessagesOutsideConfigurationTests {
    @Test func pipelineMessagesNameNoSetting() {
        let texts = [JobError.missingTopic.description, WorkerStatistics().prometheusText(ready: true)]
        for text in texts {
            let named = SettingKeys.all.filter { text.contains($0) }
            #expect(named.isEmpty, "\(named.sorted()) in \(text.prefix(200))")
        }
    }

    /// Events that go straight to their queue leave a watcher nothing to bind to: it refuses before connecting, in
    /// the broker's words, and the configuration layer names the setting to change.
    @Test func theDeadTokenWatcherRefusesNoExchangeAndConfigurationNamesIt() throws {
        let configuration = try WorkerConfiguration.load(
            from: ["PUSH_DEAD_TOKENS_EXCHANGE": ""], requiringCredentials: false)
        do {
            _ = try DeadTokenWatcher(configuration: configuration)
            Issue.record("a watcher started with no exchange")
        } catch {
            #expect(!"\(error)".contains("PUSH_") && "\(error)".contains("push.dead-tokens"), "\(error)")
            let named = try #require(ConfigurationError(naming: error))
            #expect(
                named
                    == ConfigurationError(
                        key: "PUSH_DEAD_TOKENS_EXCHANGE",
                        "empty: events go straight to "
                            + "push.dead-tokens, so there is nothing to watch without taking them"))
        }
    }
}
