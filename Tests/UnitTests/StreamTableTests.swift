@testable import HTTP2
import Testing

/// A connection's stream table against a dictionary, over the patterns connections make: identifiers rising by two
/// (a client's), streams closing out of order, the table growing and wrapping around, and every stream closed.
@Suite struct StreamTableTests {
    @Test(arguments: [1, 2])
    func behavesLikeADictionaryOfOpenStreams(firstID: Int32) {
        var table = StreamTable()
        var model: [Int32: HTTP2Stream] = [:]
        var generator = SystemRandomNumberGenerator()
        var next = firstID
        for round in 0..<20_000 {
            // Open streams while few are open; close a random one (or an unknown identifier) otherwise.
            if model.count < 300 && (model.isEmpty || Bool.random(using: &generator)) {
                let stream = HTTP2Stream(expectedHeaderBytes: 0)
                table[next] = stream
                model[next] = stream
                next += 2
            } else if round % 97 == 0 {
                #expect(table.removeValue(forKey: next + 2) == nil, "never opened")
            } else {
                let id = model.keys.randomElement(using: &generator)!
                #expect(table.removeValue(forKey: id) === model.removeValue(forKey: id))
            }
            if round % 1_000 == 0 {
                #expect(table.count == model.count)
                for (id, stream) in model { #expect(table[id] === stream, "stream \(id) after round \(round)") }
                #expect(table.entries.map(\.id) == model.keys.sorted())
            }
        }
        for id in model.keys { table[id] = nil }
        #expect(table.isEmpty && table.entries.isEmpty)
        #expect(table[firstID] == nil)
    }
}
