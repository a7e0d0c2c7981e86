import Foundation

/// The settings as given (file, environment and flags merged), read through `SettingTable`'s entries: a value of
/// the entry's type, or an error naming its key.
struct SettingValues {
    let given: [String: String]

    init(_ given: [String: String]) { self.given = given }

    /// The entry's value, or its default when it is not given (or given empty).
    func callAsFunction<Value>(_ key: KeyPath<SettingTable, Setting<Value>>) throws(ConfigurationError) -> Value {
        let setting = SettingTable.shared[keyPath: key]
        return try read(setting.name, text(setting.name) ?? setting.defaultValue, as: setting.kind)
    }

    /// The entry's value, or nil when it is not given (or given empty).
    func callAsFunction<Value>(_ key: KeyPath<SettingTable, OptionalSetting<Value>>) throws(ConfigurationError)
        -> Value?
    {
        let setting = SettingTable.shared[keyPath: key]
        guard let text = text(setting.name) else { return nil }
        return try read(setting.name, text, as: setting.kind)
    }

    /// Whether the setting was given a value, not left to its default.
    func isGiven(_ key: KeyPath<SettingTable, some SettingEntry>) -> Bool {
        text(SettingTable.shared[keyPath: key].name) != nil
    }

    /// Whether the setting is there at all, even empty (where empty means something of its own).
    func isPresent(_ key: KeyPath<SettingTable, some SettingEntry>) -> Bool {
        given[SettingTable.shared[keyPath: key].name] != nil
    }

    /// The text given for the setting, unread; nil when it is not given (or given empty).
    func text(_ key: KeyPath<SettingTable, some SettingEntry>) -> String? {
        text(SettingTable.shared[keyPath: key].name)
    }

    private func text(_ name: String) -> String? {
        guard let text = given[name]?.trimmingCharacters(in: .whitespaces), !text.isEmpty else { return nil }
        return text
    }

    private func read<Value>(
        _ name: String, _ text: String,
        as kind: SettingKind<Value>
    ) throws(ConfigurationError) -> Value {
        do { return try kind.read(text) } catch { throw ConfigurationError(key: name, error.text) }
    }
}
