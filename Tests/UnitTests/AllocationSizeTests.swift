import Foundation
import Testing

@testable import HTTP2
@testable import WorkerPipeline

/// The objects every job or request allocates stay within the 120 bytes glibc serves from its fast bins (a chunk
/// of 128): freed and made by the hundred, anything larger goes through malloc's slow path. A new field that
/// crosses the line fails here rather than in a profile. (Release builds allocate with mimalloc, Package.swift, whose
/// small size classes are cheaper too; these tests run the debug build, on glibc's.)
// glibc's malloc_usable_size (malloc.h, which the Glibc module does not bring).
@_silgen_name("malloc_usable_size") private func mallocUsableSize(_ pointer: UnsafeMutableRawPointer?) -> Int

@Suite struct AllocationSizeTests {
    static let fastBinLimit = 120

    /// The bytes malloc gave an object.
    static func allocatedBytes(_ object: AnyObject) -> Int {
        mallocUsableSize(Unmanaged.passUnretained(object).toOpaque())
    }

    @Test func aDeliveryFitsAFastBin() {
        let delivery = JobDelivery(tag: 1, redelivered: false, body: [], properties: MessageProperties())
        #expect(
            Self.allocatedBytes(delivery) <= Self.fastBinLimit, "JobDelivery: \(Self.allocatedBytes(delivery)) bytes")
    }

    @Test func aJobsProgressFitsAFastBin() throws {
        let job = try PushJob.decode(
            Array(#"{"tokens": ["\#(String(repeating: "ab", count: 32))"], "payload": {}}"#.utf8),
            defaultTopic: "com.example.app", fallbackID: "j")
        let delivery = JobDelivery(tag: 1, redelivered: false, body: [], properties: MessageProperties())
        let progress = JobProgress(job: job, delivery: delivery, generation: 1, targets: [], hasStableID: true)
        #expect(
            Self.allocatedBytes(progress) <= Self.fastBinLimit, "JobProgress: \(Self.allocatedBytes(progress)) bytes")
    }

    /// A server's stream, one per request apns-sim answers, carries none of a client's request.
    @Test func aServerStreamFitsAFastBin() {
        let stream = HTTP2Stream(expectedHeaderBytes: 768)
        #expect(
            Self.allocatedBytes(stream) <= Self.fastBinLimit, "HTTP2Stream: \(Self.allocatedBytes(stream)) bytes")
    }

    /// An answer's header block at first: a Swift array uses all of its allocation, so a capacity above 88 bytes (120
    /// less the array's 32-byte header) means a larger chunk.
    @Test func anAnswersFirstHeaderBlockFitsAFastBin() {
        var block: [UInt8] = []
        block.reserveCapacity(HTTP2RequestStream.answerHeaderCapacity)
        #expect(block.capacity <= Self.fastBinLimit - 32, "capacity \(block.capacity)")
    }
}
