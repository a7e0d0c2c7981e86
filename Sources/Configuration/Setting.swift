/// The programs of apns-worker that read settings: a setting's help lists it under each program that reads it.
public struct Programs: OptionSet, Sendable, Hashable {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }

    /// `apns-worker run`.
    public static let worker = Programs(rawValue: 1 << 0)
    public static let cleanup = Programs(rawValue: 1 << 1)
    public static let enqueue = Programs(rawValue: 1 << 2)
    public static let tokens = Programs(rawValue: 1 << 3)
    public static let stats = Programs(rawValue: 1 << 4)
    /// `apns-worker dead-tokens tail`.
    public static let deadTokensTail = Programs(rawValue: 1 << 5)
    /// `apns-worker channels`.
    public static let channels = Programs(rawValue: 1 << 6)

    public static let all: Programs = [.worker, .cleanup, .enqueue, .tokens, .stats, .deadTokensTail, .channels]
    /// Every program that talks to the broker.
    public static let brokerClients: Programs = [.worker, .cleanup, .enqueue, .stats, .deadTokensTail]
}

/// What every setting declares, whatever its value's type: what the unknown-key check, the help lists and the
/// check of config/apns-worker.env read.
public protocol SettingEntry: Sendable {
    /// The environment variable (and file key).
    var name: String { get }
    /// The kind of value, as the help names it ("whole number 1..64").
    var kindDescription: String { get }
    /// The value used when the setting is not given, as config/apns-worker.env writes it; nil when there is none.
    var defaultText: String? { get }
    /// What not giving it means, for a setting without a default value ("none", or a rule).
    var unsetMeans: String { get }
    var readers: Programs { get }
    /// One line of help.
    var help: String { get }
}

/// A setting with a default: reading it always gives a value.
public struct Setting<Value>: SettingEntry {
    public let name: String
    public let kind: SettingKind<Value>
    public let defaultValue: String
    public let readers: Programs
    public let help: String

    public var kindDescription: String { kind.description }
    public var defaultText: String? { defaultValue }
    public var unsetMeans: String { defaultValue }
}

/// A setting without a default value: reading it gives nil when it is not given (or given empty).
public struct OptionalSetting<Value>: SettingEntry {
    public let name: String
    public let kind: SettingKind<Value>
    public var unsetMeans = "none"
    public let readers: Programs
    public let help: String

    public var kindDescription: String { kind.description }
    public var defaultText: String? { nil }
}
