import AMQP
import AMQPBroker
import APNs
import Foundation
import Redis
import TLS
import Telemetry

/// What is wrong with a setting's text, in words that follow the key's name in `ConfigurationError`.
public struct SettingProblem: Error, Sendable {
    public let text: String
    public init(_ text: String) { self.text = text }
}

/// A kind of setting value: how its text is read into a typed value (or refused, saying why), and how the help
/// names it.
public struct SettingKind<Value>: Sendable {
    public let description: String
    let read: @Sendable (String) throws(SettingProblem) -> Value

    init(_ description: String, read: @escaping @Sendable (String) throws(SettingProblem) -> Value) {
        self.description = description
        self.read = read
    }
}

extension SettingKind where Value == Int {
    static func wholeNumber(_ range: ClosedRange<Int>) -> SettingKind {
        SettingKind("whole number \(range.lowerBound)..\(range.upperBound)") { text throws(SettingProblem) in
            guard let number = Int(text), range.contains(number) else {
                throw SettingProblem(
                    "\"\(text)\" is not a whole number from \(range.lowerBound) to \(range.upperBound)")
            }
            return number
        }
    }
}

extension SettingKind where Value == Double {
    /// Up to a day: a longer wait is a mistake (milliseconds given as seconds, say).
    static var seconds: SettingKind {
        SettingKind("seconds > 0, at most 86400") { text throws(SettingProblem) in
            guard let number = Double(text), number > 0, number <= 86_400 else {
                throw SettingProblem("\"\(text)\" is not a number of seconds above 0 and at most 86400 (a day)")
            }
            return number
        }
    }

    static var fraction: SettingKind {
        SettingKind("number 0..1") { text throws(SettingProblem) in
            guard let number = Double(text), (0...1).contains(number) else {
                throw SettingProblem("\"\(text)\" is not a number from 0 to 1 (a share, e.g. 0.2)")
            }
            return number
        }
    }
}

extension SettingKind where Value == [Double] {
    /// Sorted, so that retry number n waits the n-th shortest.
    static var secondsList: SettingKind {
        SettingKind("seconds 0.001..86400, comma-separated") { text throws(SettingProblem) in
            // Empty items are refused, not skipped: "60,,1" is more likely a lost value than two.
            var delays: [Double] = []
            for item in text.split(separator: ",", omittingEmptySubsequences: false) {
                let trimmed = item.trimmingCharacters(in: .whitespaces)
                guard let delay = Double(trimmed), delay >= 0.001, delay <= 86_400 else {
                    throw SettingProblem(
                        "\"\(trimmed)\" in \"\(text)\" is not a number of seconds from 0.001 to 86400; the list is "
                            + "comma-separated, e.g. 1,15,60,300")
                }
                delays.append(delay)
            }
            return delays.sorted()
        }
    }
}

extension SettingKind where Value == Bool {
    static var flag: SettingKind {
        SettingKind("true|false (or 1|0)") { text throws(SettingProblem) in
            let word = text.lowercased()
            guard ["true", "false", "1", "0"].contains(word) else {
                throw SettingProblem("\"\(text)\" is not true or false (1 or 0)")
            }
            return word == "true" || word == "1"
        }
    }
}

extension SettingKind where Value == String {
    static var text: SettingKind { SettingKind("text") { $0 } }

    /// A queue or exchange name (AMQP's limit) the worker declares: not one of the broker's own (`amq.`).
    static var brokerName: SettingKind {
        SettingKind("name, at most 255 bytes, not starting with amq.") { text throws(SettingProblem) in
            guard text.utf8.count <= 255 else { throw SettingProblem("queue names are at most 255 bytes") }
            guard !text.hasPrefix("amq.") else {
                throw SettingProblem("names starting with amq. are the broker's own, which it refuses to declare")
            }
            return text
        }
    }

    /// A CA bundle (PEM) the program can read and OpenSSL can load, checked at start: a file of anything else
    /// would fail every connection it is for, and the worker would wait on them for ever.
    static var caFile: SettingKind {
        SettingKind("path of a PEM CA bundle") { path throws(SettingProblem) in
            let readable = try file.read(path)
            do throws(TLSError) { try TLSError.checkCAFile(readable) } catch { throw SettingProblem(error.message) }
            return readable
        }
    }

    /// A file the program can read, checked at start rather than when it is first needed.
    static var file: SettingKind {
        SettingKind("path") { path throws(SettingProblem) in
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
                throw SettingProblem("no file \(path)")
            }
            guard !isDirectory.boolValue else { throw SettingProblem("\(path) is a directory, not a file") }
            guard FileManager.default.isReadableFile(atPath: path) else {
                throw SettingProblem("cannot read file \(path) (permissions)")
            }
            return path
        }
    }

    static var topic: SettingKind {
        SettingKind("APNs topic (a bundle ID)") { text throws(SettingProblem) in
            if let problem = APNsRules.topicProblem(text) { throw SettingProblem(problem) }
            return text
        }
    }
}

extension SettingKind where Value == AMQPNodes {
    static var brokerNodes: SettingKind {
        SettingKind("amqp[s]://user:password@host:port/vhost, or several comma-separated") {
            text throws(SettingProblem) in
            do throws(AMQPError) { return try AMQPNodes(text) } catch { throw SettingProblem(error.message) }
        }
    }
}

extension SettingKind where Value == RedisURL {
    static var redisURL: SettingKind {
        SettingKind("redis://[[user]:password@]host:port/db, rediss:// for TLS") { text throws(SettingProblem) in
            do throws(RedisError) { return try RedisURL(text) } catch { throw SettingProblem(error.message) }
        }
    }
}

extension SettingKind where Value == [RedisAddress] {
    static var redisAddresses: SettingKind {
        SettingKind("host:port, comma-separated") { text throws(SettingProblem) in
            do throws(RedisError) { return try RedisAddress.list(text) } catch { throw SettingProblem(error.message) }
        }
    }
}

extension SettingKind where Value == APNsEndpoint {
    static var endpoint: SettingKind {
        SettingKind("https://host[:port]") { text throws(SettingProblem) in
            do throws(APNsConfigurationError) { return try APNsEndpoint(url: text) } catch {
                throw SettingProblem(error.description)
            }
        }
    }
}

extension SettingKind where Value == QueueType {
    static var queueType: SettingKind {
        SettingKind("classic|quorum") { text throws(SettingProblem) in
            guard let type = QueueType(rawValue: text.lowercased()) else {
                throw SettingProblem("\"\(text)\" is not classic or quorum")
            }
            return type
        }
    }
}

extension SettingKind where Value == Logger.Level {
    static var logLevel: SettingKind {
        SettingKind("trace|debug|info|notice|warning|error|critical") { text throws(SettingProblem) in
            guard let level = Logger.Level(name: text) else {
                throw SettingProblem("\"\(text)\" is not trace, debug, info, notice, warning, error or critical")
            }
            return level
        }
    }
}

extension SettingKind where Value == Logger.Format {
    static var logFormat: SettingKind {
        SettingKind("json|text") { text throws(SettingProblem) in
            guard let format = Logger.Format(rawValue: text.lowercased()) else {
                throw SettingProblem("\"\(text)\" is not json or text")
            }
            return format
        }
    }
}

extension SettingKind where Value == APNsProxy {
    static var proxyURL: SettingKind {
        SettingKind("http://[user:password@]host:port") { text throws(SettingProblem) in
            do throws(APNsProxy.URLError) { return try APNsProxy(text) } catch {
                throw SettingProblem(error.description)
            }
        }
    }
}
