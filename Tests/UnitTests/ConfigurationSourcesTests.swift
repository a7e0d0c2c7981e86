import AMQP
import APNs
import Configuration
import Foundation
import HTTP2
import JSON
import Redis
import ServiceURLs
import Telemetry
import Testing
import WorkerPipeline

@Suite struct ConfigurationSourcesTests {
    @Test func readsKeyValueLinesWithCommentsExportsAndQuotes() throws {
        let values = try ConfigurationSources.parseFile(
            """
            # a comment

            AMQP_URL=amqp://u:p@h:5672/%2f
            export APNS_TOPIC = "com.example.app"
            LOG_LEVEL='debug'
            EMPTY=
            """, name: "test.env")
        #expect(
            values == [
                "AMQP_URL": "amqp://u:p@h:5672/%2f", "APNS_TOPIC": "com.example.app", "LOG_LEVEL": "debug",
                "EMPTY": ""
            ])
    }

    @Test func aBadLineIsNamedWithItsNumber() {
        #expect(throws: ConfigurationError(key: "--config", "f.env line 2: expected KEY=VALUE")) {
            try ConfigurationSources.parseFile("A=1\njust words\n", name: "f.env")
        }
        #expect(throws: ConfigurationError.self) { try ConfigurationSources.readFile("/nonexistent/file.env") }
    }

    /// `KEY=value # note` is `value` to a shell and `value # note` to systemd: refused, naming the line and key (not
    /// the value, which may be a password). A `#` inside quotes or not after a space is part of the value for both.
    @Test func aCommentAfterAValueIsRefusedNamingTheLine() throws {
        for line in [
            "PUSH_JOBS_QUEUE=push.jobs # urgent lane", "PUSH_JOBS_QUEUE=\"push.jobs\" # urgent", "A=b\t#c",
            "AMQP_HEARTBEAT= # the broker's default"
        ] {
            #expect(throws: ConfigurationError.self, "\(line)") {
                try ConfigurationSources.parseFile("LOG_LEVEL=info\n" + line + "\n", name: "f.env")
            }
        }
        do {
            _ = try ConfigurationSources.parseFile("AMQP_URL=amqp://u:secret@h/%2f #broker\n", name: "f.env")
            Issue.record("a comment after a URL was taken")
        } catch {
            #expect(error.description.contains("f.env line 1 (AMQP_URL)"), "\(error)")
            #expect(!error.description.contains("secret"), "\(error)")
        }
        let values = try ConfigurationSources.parseFile(
            "A=\"a # b\"\nB=x#y\nC='#'\nD=#\n", name: "f.env")
        #expect(values == ["A": "a # b", "B": "x#y", "C": "#", "D": "#"])
    }

    /// A file saved on Windows: every line is read, no value keeps a carriage return, a bad line has its number.
    @Test func linesEndingInCRLFAreReadLikeLF() throws {
        let values = try ConfigurationSources.parseFile(
            "# written on Windows\r\nLOG_LEVEL=debug\r\nAPNS_TOPIC=com.example.app\r\n",
            name: "windows.env")
        #expect(values == ["LOG_LEVEL": "debug", "APNS_TOPIC": "com.example.app"])
        #expect(throws: ConfigurationError(key: "--config", "windows.env line 2: expected KEY=VALUE")) {
            try ConfigurationSources.parseFile("A=1\r\njust words\r\n", name: "windows.env")
        }
    }

    @Test func flagsBeatTheEnvironmentWhichBeatsTheFile() {
        let merged = ConfigurationSources.merge(
            file: ["A": "file", "B": "file", "C": "file"],
            environment: ["B": "environment", "C": "environment"],
            flags: ["C": "flag"])
        #expect(merged == ["A": "file", "B": "environment", "C": "flag"])
    }
}
