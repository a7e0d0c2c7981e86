import APNs
import Configuration
import Testing

@Suite struct APNsIDGeneratorTests {
    @Test func producesDistinctCanonicalUUIDs() {
        var generator = APNsIDGenerator(seed: 42)
        let ids = (0..<1000).map { _ in generator.next() }
        #expect(ids.allSatisfy(APNsNotification.isCanonicalUUID))
        #expect(Set(ids).count == 1000)
        #expect(ids.allSatisfy { Array($0.utf8)[14] == UInt8(ascii: "4") }, "version 4 layout")
    }
}
