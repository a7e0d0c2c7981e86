import APNs
import Foundation
import Testing
import WorkerPipeline

@testable import JSON

@Suite struct JSONReaderTests {
    @Test func parsesEscapesAndUnicode() throws {
        let value = try JSONReader.parse(Array(#"{"a":"\u00e9\ud83d\ude00\n","b":[true,false,null,-1.5e3]}"#.utf8))
        #expect(value["a"] == .string("é😀\n"))
        #expect(value["b"] == .array([.bool(true), .bool(false), .null, .number("-1.5e3")]))
    }

    @Test(arguments: [
        "", "{", "{\"a\":}", "[1,]", "01", "\"\\x\"", "{\"a\":1}x", "\"\u{1}\"", "tru", "\"\\ud800\"",
        "\"\\u+041\"", "\"\\u-000\"", "\"\\u00e\""
    ])
    func rejectsInvalidJSON(text: String) {
        #expect(throws: JSONError.self) { try JSONReader.parse(Array(text.utf8)) }
    }

    /// Payloads good and bad, each placed as the value of a member read by `checkValue`: checking without building
    /// must accept and refuse exactly what building does, with the same error at the same byte, and measure the same
    /// depth.
    static let payloads = [
        #"{"aps":{"alert":{"title":"T","body":"B"},"badge":1},"k":[1,-2.5e3,true,false,null,"x",{}]}"#,
        #"{"a":"\u00e9\ud83d\ude00\n","b":"é😀 ok","c":[[[]]],"d":{}}"#, #"[]"#, #"[{"a":1},{"a":1}]"#, #""text""#,
        #"12"#,
        #"{"a":1,"a":2}"#, #"{"a":1,"\u0061":2}"#, #"{"\u0061":1,"a":2}"#, #"{"é":1,"\u00e9":2}"#,
        #"{"x":{"a":1,"b":{"a":2}},"y":{"a":{"a":{}}}}"#, #"{"ab":1,"a":2,"b":3,"ba":4}"#,
        #"{"x":{"alert":"a","alert":"b"}}"#, #"[1,]"#, #"{"a":}"#, #"{"a" 1}"#, #"{"a":1 "b":2}"#, #"["\x"]"#,
        #"["\ud800"]"#, "[\"\u{1}\"]", #"[01]"#, #"[-]"#, #"[1.]"#, #"[1e]"#, #"[tru]"#, #"{"a":[1,2}"#, #"{"#, #"["#,
        #"{"a":"unterminated}"#, #"{1:2}"#, #"[[[[[[[[[[1]]]]]]]]]]"#,
        "{" + (0..<40).map { #""k\#($0)":\#($0)"# }.joined(separator: ",") + #","k7":0}"#,
        "{" + (0..<40).map { #""k\#($0)":\#($0)"# }.joined(separator: ",") + #","\u006b7":0}"#,
        "{" + (0..<40).map { #""k\#($0)":\#($0)"# }.joined(separator: ",") + "}",
        // Names past the reader's first 512 bytes of them, nested past its first 32 names.
        "{" + (0..<20).map { #""\#(String(repeating: "n", count: 40))\#($0)":{"a\#($0)":1}"# }.joined(separator: ",")
            + "}",
        "{" + (0..<20).map { #""\#(String(repeating: "n", count: 40))\#($0)":{"a":1}"# }.joined(separator: ",")
            + #","\#(String(repeating: "n", count: 40))7":2}"#
    ]

    /// `check` accepts and refuses exactly what `parse` does, with the same error at the same byte, duplicate keys
    /// allowed or not, and tells an object from anything else as deep as `parse` measures it.
    @Test(arguments: payloads)
    func checkingAWholeDocumentAgreesWithParsingIt(payload: String) {
        for allowsDuplicateKeys in [false, true] {
            let bytes = Array(payload.utf8)
            let parsed = Result { () throws(JSONError) in
                try JSONReader.parseMeasuringDepth(bytes, allowsDuplicateKeys: allowsDuplicateKeys)
            }
            let checked = Result { () throws(JSONError) in
                try JSONReader.check(bytes, allowsDuplicateKeys: allowsDuplicateKeys)
            }
            switch (parsed, checked) {
            case (.success(let full), .success(.object(let depth))):
                #expect(full.value.typeName == "an object")
                #expect(depth == full.depth)
            case (.success(let full), .success(.other(let typeName))):
                #expect(full.value.typeName == typeName)
                #expect(typeName != "an object")
            case (.failure(let full), .failure(let checked)):
                #expect(full == checked)
            default:
                Issue.record("parsed: \(parsed), checked: \(checked), duplicate keys allowed: \(allowsDuplicateKeys)")
            }
        }
    }

    /// `checkObject` checks most payloads in one loop of its own (`JSONQuickCheck`), which must accept only what
    /// the reader's general steps accept, and end each object where they do: the payloads above and every one-byte
    /// change to three valid ones, at depths that leave room for them and depths that do not.
    @Test func theQuickCheckAcceptsOnlyWhatTheReaderAccepts() throws {
        var documents = Self.payloads.map { Array($0.utf8) }
        let usual = #"{"aps":{"alert":{"title":"T","body":"B"},"badge":1},"sent_at_us":1765000000000000}"#
        for payload in Self.payloads.prefix(2) + [usual, #"{"n":[1,{"m":-0.5E+2}],"s":"x y","t":true,"z":null}"#] {
            let bytes = Array(payload.utf8)
            for index in bytes.indices {
                documents.append(Array(bytes[..<index] + bytes[(index + 1)...]))
                for byte in Array(#""\{}[],:0-e.E +af"#.utf8) + [0x01, 0xC3] where byte != bytes[index] {
                    var changed = bytes
                    changed[index] = byte
                    documents.append(changed)
                }
            }
        }
        let lead = Array(#"{"payload": "#.utf8)
        var quick = 0
        for document in documents {
            let buffer = lead + document + Array(" }".utf8)
            buffer.withUnsafeBufferPointer { bytes in
                for (depth, maximumDepth) in [(2, 32), (2, 4), (3, 4), (1, 1), (2, 1)] {
                    let text = "\(String(decoding: document, as: UTF8.self)) at depth \(depth) of \(maximumDepth)"
                    let reader = Result { () throws(JSONError) in
                        try JSONReader.checkObjectReading(
                            in: bytes, at: lead.count, depth: depth, maximumDepth: maximumDepth)
                    }
                    let checked = Result { () throws(JSONError) in
                        try JSONReader.checkObject(in: bytes, at: lead.count, depth: depth, maximumDepth: maximumDepth)
                    }
                    guard
                        let end = JSONQuickCheck.objectEnd(
                            in: bytes, at: lead.count, depth: depth, maximumDepth: maximumDepth)
                    else {
                        #expect(checked == reader, "\(text)")
                        continue
                    }
                    quick += 1
                    #expect(reader == .success(end), "\(text)")
                    #expect(checked == .success(end), "\(text)")
                }
            }
        }
        // An offset outside the bytes is refused by the reader, with its reason, not read.
        let outside = Array("{}".utf8).withUnsafeBufferPointer { bytes in
            [-1, 2].map { offset in
                Result { () throws(JSONError) in
                    try JSONReader.checkObject(in: bytes, at: offset, depth: 1, maximumDepth: 32)
                }
            }
        }
        #expect(outside.allSatisfy { if case .failure = $0 { true } else { false } })
        // The payloads jobs carry take the quick loop.
        #expect(
            Array(usual.utf8).withUnsafeBufferPointer {
                JSONQuickCheck.objectEnd(in: $0, at: 0, depth: 2, maximumDepth: 32)
            } == usual.utf8.count)
        #expect(quick > 100)
    }

    @Test(arguments: payloads)
    func checkedMembersAreCheckedAsStrictlyAsBuiltOnes(payload: String) {
        var document = Array(#"{"id":"j","payload":"#.utf8)
        document += Array(payload.utf8) + [UInt8(ascii: "}")]
        let invalidUTF8 = Array(#"{"payload":{"a":""#.utf8) + [0xC3, 0x28] + Array(#""}}"#.utf8)
        for bytes in [document, invalidUTF8] {
            let built = Result { () throws(JSONError) in try JSONReader.parseMeasuringDepth(bytes, maximumDepth: 8) }
            var checkedPayload: JSONMember?
            let checked = Result { () throws(JSONError) in
                try JSONReader.readObject(bytes, maximumDepth: 8, known: JSONNames(["payload"])) {
                    reader, index throws(JSONError) in
                    guard index == 0 else { return }
                    let start = reader.offset
                    let value = try reader.checkValue()
                    checkedPayload = JSONMember(key: "payload", value: value, range: start..<reader.offset)
                }
            }
            switch (built, checked) {
            case (.success(let full), .success(let topLevel)):
                #expect(topLevel == .object(depth: full.depth))
                let range = checkedPayload?.range
                #expect(range == full.value.member("payload")?.range)
                if bytes == document { #expect(range.map { Array(bytes[$0]) } == Array(payload.utf8)) }
                // Scalars come back as read; objects and arrays empty, of the same kind.
                switch (full.value["payload"], checkedPayload?.value) {
                case (.object?, .object([])?), (.array?, .array([])?): break
                case (let a, let b): #expect(a == b)
                }
            case (.failure(let full), .failure(let checked)):
                #expect(full == checked)
            default:
                Issue.record("built: \(built), checked: \(checked)")
            }
        }
    }

    /// Strings are scanned eight bytes at a time: an end, an escape, a control character or a non-ASCII byte at
    /// every offset of a word is still found.
    @Test func stringsAreReadWhereverTheirEndEscapeOrBadByteFalls() throws {
        for offset in 0..<20 {
            let before = String(repeating: "a", count: offset)
            func parse(_ middle: [UInt8]) -> Result<JSONValue, JSONError> {
                let bytes = Array(#"{"k":""#.utf8) + Array(before.utf8) + middle + Array(#"bcdefghij","n":1}"#.utf8)
                return Result { () throws(JSONError) in try JSONReader.parse(bytes) }
            }
            #expect(try parse(Array(#"\""#.utf8)).get()["k"] == .string(before + "\"bcdefghij"))
            #expect(try parse(Array("é".utf8)).get()["k"] == .string(before + "ébcdefghij"))
            #expect(try parse(Array(#"""#.utf8) + Array(#","x":""#.utf8)).get()["x"] == .string("bcdefghij"))
            for bad: [UInt8] in [[0x01], [0x1F], [0xC3, 0x28], [0xFF]] {
                #expect(throws: JSONError.self, "byte \(bad) at \(offset)") { try parse(bad).get() }
                // The bad byte the last before the string's end.
                #expect(throws: JSONError.self, "byte \(bad) at \(offset), then the end") {
                    try parse(bad + Array(#"","x":""#.utf8)).get()
                }
            }
        }
    }

    /// Names are told apart by their bytes however many an object has: é precomposed and decomposed are two names
    /// (as for Python, JavaScript or Go, whose disagreement the duplicate check is about); the same é twice, once
    /// escaped, is one name given twice.
    @Test func namesAreToldApartByTheirBytes() throws {
        let others = (0..<20).map { #""k\#($0)":0,"# }
        for count in [0, 20] {
            let prefix = others.prefix(count).joined()
            let distinct = "{" + prefix + "\"\u{E9}\":1,\"e\u{301}\":2}"
            guard case .object(let members) = try JSONReader.parse(Array(distinct.utf8)) else {
                Issue.record("not an object")
                return
            }
            #expect(members.count == count + 2, "\(count) other names")
            let same = "{" + prefix + "\"\u{E9}\":1,\"\\u00e9\":2}"
            #expect(throws: JSONError.self, "\(count) other names") { try JSONReader.parse(Array(same.utf8)) }
        }
    }

    @Test func namesPastTheReadersFirstStorageKeepTheirBytes() throws {
        let long = String(repeating: "n", count: 40)
        let names = (0..<40).map { "\(long)\($0)" }
        let document = "{" + names.map { #""\#($0)":{"a":1}"# }.joined(separator: ",") + "}"
        guard case .object(let members) = try JSONReader.parse(Array(document.utf8)) else {
            Issue.record("not an object")
            return
        }
        #expect(members.map(\.key) == names)
        let repeated = "{" + names.map { #""\#($0)":1"# }.joined(separator: ",") + #","\#(names[7])":2}"#
        #expect(throws: JSONError.self) { try JSONReader.parse(Array(repeated.utf8)) }
        do { _ = try JSONReader.parse(Array(repeated.utf8)) } catch {
            #expect(error.description.hasPrefix("duplicate key \"\(names[7])\""))
        }
    }

    @Test func membersAreReadIntoTheirOwnFieldsAndDuplicatesRefusedAtTheTopToo() throws {
        let names = JSONNames(["users", "n"])
        var users: JSONStrings?
        var others: [JSONValue] = []
        let document = Array(#"{"x": {"users": 1}, "users": ["a", "\u00e9"], "n": [1, "b"], "users2": 3}"#.utf8)
        let topLevel = try JSONReader.readObject(document, known: names) { reader, index throws(JSONError) in
            switch index {
            case 0?: users = try reader.readStrings()
            case 1?: others.append(try reader.readValue())
            default: break
            }
        }
        #expect(topLevel == .object(depth: 2))
        #expect(users == .strings(["a", "é"]))
        #expect(others == [.array([.number("1"), .string("b")])])
        var strings: [JSONStrings] = []
        _ = try JSONReader.readObject(Array(#"{"n": [1, "b"], "users": "u"}"#.utf8), known: names) {
            reader, _ throws(JSONError) in
            strings.append(try reader.readStrings())
        }
        #expect(strings == [.notAString(index: 0, typeName: "a number"), .other(.string("u"))])
        #expect(
            try JSONReader.readObject(Array("[1]".utf8), known: names) { _, _ throws(JSONError) in }
                == .other(typeName: "an array"))
        let repeated = Array(#"{"users": [], "us\u0065rs": []}"#.utf8)
        do {
            _ = try JSONReader.readObject(repeated, known: names) { reader, _ throws(JSONError) in
                _ = try reader.readStrings()
            }
            Issue.record("accepted a name given twice")
        } catch {
            #expect(error.description == #"duplicate key "users" at byte 14"#)
        }
    }
}
