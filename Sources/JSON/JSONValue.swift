/// A JSON value as `JSONReader` builds it.
// Not `indirect`: arrays and objects already hold their children in array storage, so a scalar costs no box.
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    /// The number's text, as written.
    case number(String)
    case string(String)
    case array([JSONValue])
    case object([JSONMember])

    public var typeName: String {
        switch self {
        case .null: "null"
        case .bool: "a boolean"
        case .number: "a number"
        case .string: "a string"
        case .array: "an array"
        case .object: "an object"
        }
    }

    public subscript(key: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.key == key }?.value
    }

    public func member(_ key: String) -> JSONMember? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.key == key }
    }
}

public struct JSONMember: Sendable, Equatable {
    public var key: String
    public var value: JSONValue
    /// Where the value's text sits in the document.
    public var range: Range<Int>

    public init(key: String, value: JSONValue, range: Range<Int>) {
        self.key = key
        self.value = value
        self.range = range
    }
}

/// The member names a caller of `JSONReader.readObject` knows, matched byte for byte as each member is met.
public struct JSONNames: Sendable {
    let names: [[UInt8]]
    /// The indices of the names of each length: a member is compared with the few names as long as it, not all.
    private let indicesByLength: [[Int]]

    public init(_ names: [String]) {
        self.names = names.map { Array($0.utf8) }
        var indicesByLength = Array(repeating: [Int](), count: (self.names.map(\.count).max() ?? 0) + 1)
        for (index, name) in self.names.enumerated() { indicesByLength[name.count].append(index) }
        self.indicesByLength = indicesByLength
    }

    /// The index of the name held by `bytes`, if it is one of them.
    func index(of bytes: UnsafeBufferPointer<UInt8>) -> Int? {
        guard bytes.count < indicesByLength.count else { return nil }
        for index in indicesByLength[bytes.count] {
            if names[index].withUnsafeBufferPointer({ JSONBytes.same($0, bytes) }) { return index }
        }
        return nil
    }
}

/// An array of strings as `JSONReader.readStrings` found it.
public enum JSONStrings: Sendable, Equatable {
    case strings([String])
    /// Not an array: the value as read.
    case other(JSONValue)
    /// An array holding something other than a string, at `index` (the first such element).
    case notAString(index: Int, typeName: String)
}

/// What the top level of a document read by `JSONReader.readObject` was.
public enum JSONTopLevel: Sendable, Equatable {
    /// An object, read member by member; `depth` is how deep it nests (the object itself is depth 1).
    case object(depth: Int)
    /// Something else, read whole and valid.
    case other(typeName: String)
}

public struct JSONError: Error, Sendable, Equatable, CustomStringConvertible {
    public var offset: Int
    public var message: String
    /// The document nests deeper than the reader allowed: a caller that widened the limit for some documents can
    /// then state the one that applies.
    public var isTooDeep = false
    public var description: String { "\(message) at byte \(offset)" }
}
