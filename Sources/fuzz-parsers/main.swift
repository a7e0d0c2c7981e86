import APNs
import Configuration
import Foundation
import HTTP2
import Redis
import WorkerPipeline

// Coverage-guided fuzz targets (libFuzzer) over every parser that reads bytes from outside, one per run, chosen by
// FUZZ_PARSER (scripts/fuzz runs each):
//   jobs         the job decoder with its Live Activity and broadcast fields, the retry form, registration and
//                dead-token events, APNs error bodies;
//   credentials  the credentials file (APNS_CREDENTIALS_FILE);
//   redis        RESP replies as the reader over TLS reads them, fed in chunks, then read as Sentinel and Cluster
//                answers (get-master-addr-by-name, CLUSTER SLOTS, MOVED, ASK) and as not-serving errors;
//   proxy        a CONNECT proxy's answer;
//   channels     the channel management API's answers.
// Each checks what it accepts (a broken invariant traps, and libFuzzer keeps the input). Built normally this is an
// empty program; scripts/fuzz builds it with -sanitize=fuzzer,address -parse-as-library -DFUZZING.

enum FuzzedParser: String, CaseIterable {
    case jobs, credentials, redis, proxy, channels

    static let chosen: FuzzedParser = {
        let name = ProcessInfo.processInfo.environment["FUZZ_PARSER"] ?? "jobs"
        guard let parser = FuzzedParser(rawValue: name) else {
            fatalError("FUZZ_PARSER=\(name): one of \(allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return parser
    }()

    func run(_ bytes: [UInt8]) {
        switch self {
        case .jobs: Self.jobs(bytes)
        case .credentials: Self.credentials(bytes)
        case .redis: Self.redis(bytes)
        case .proxy: Self.proxy(bytes)
        case .channels: Self.channels(bytes)
        }
    }

    static func jobs(_ bytes: [UInt8]) {
        if let job = try? PushJob.decode(bytes, defaultTopic: "com.example.app", fallbackID: "fuzz") {
            // What is accepted must be actionable, and its retry form must read back the same.
            let targets = job.retryTargets?.count ?? (job.users.count + job.tokens.count)
            switch job.kind {
            case .devices:
                precondition(targets > 0, "an accepted job without targets")
            case .liveActivity(let activity):
                precondition(targets > 0 || activity != nil, "an accepted Live Activity job without targets")
                precondition(
                    job.pushType == .liveactivity || job.pushType == .background,
                    "a Live Activity job sent as \(job.pushType)")
            case .broadcast(let channel):
                precondition((try? APNsChannelID.check(channel)) != nil, "an accepted broadcast with a bad channel id")
            }
            precondition(
                !job.topic.isEmpty && job.payload.count <= job.pushType.maximumPayloadSize,
                "an accepted job without a topic or a valid payload")
            if let retryTargets = job.retryTargets {
                let again = try? PushJob.decode(
                    job.retryBody(targets: retryTargets, original: bytes), defaultTopic: nil,
                    fallbackID: "")
                precondition(
                    again?.retryTargets == retryTargets && again?.payload == job.payload
                        && again?.originalBody == (job.originalBody ?? bytes), "retry round trip")
            }
        }
        // A reading time in ms (2027): a registration's own time is checked against it.
        let now: Int64 = 1_800_000_000_000
        if let event = try? RegistrationEvent.decode(bytes, now: now) {
            precondition((try? RegistrationEvent.decode(event.json, now: now)) == event, "registration round trip")
        }
        _ = try? DeadTokenEvent.decode(bytes)
        _ = APNsResponse.parseBody(bytes)
    }

    static func credentials(_ bytes: [UInt8]) {
        guard let file = try? CredentialsFile.parse(Data(bytes), path: "/etc/apns-worker/credentials.json") else {
            return
        }
        for entry in file.entries {
            precondition(!entry.topics.isEmpty && entry.rateLimit >= 0, "an accepted entry without topics")
            switch entry.proof {
            case .signingKey(let file, let keyID, let teamID):
                precondition(file.hasPrefix("/") && !keyID.isEmpty && !teamID.isEmpty, "a key entry half read")
            case .certificate(let file, let keyFile):
                precondition(file.hasPrefix("/") && (keyFile?.hasPrefix("/") ?? true), "a relative path kept")
            }
        }
    }

    /// The first byte sets the chunk size the reader is fed in (as reads arrive) and whether replies are read whole or
    /// as hashes in place (a user's tokens); the rest is the stream.
    static func redis(_ bytes: [UInt8]) {
        guard let first = bytes.first else { return }
        let reader = RedisReplyReader(capacity: 64)
        let asHashes = first & 0x80 != 0
        let stream = bytes.dropFirst()
        let chunk = Int(first % 32) + 1
        let asked = RedisAddress(host: "10.0.0.1", port: 6379)
        var offset = stream.startIndex
        while offset < stream.endIndex {
            let end = min(offset + chunk, stream.endIndex)
            stream[offset..<end].withUnsafeBytes { reader.feed($0) }
            offset = end
            // After a protocol error the reader is done with, as the connection is.
            guard (try? readAll(reader, asHashes: asHashes, askedAt: asked)) != nil else { return }
        }
    }

    /// Every whole reply the reader holds.
    private static func readAll(_ reader: RedisReplyReader, asHashes: Bool, askedAt asked: RedisAddress)
        throws(RedisError)
    {
        while true {
            if asHashes {
                var pairs = 0
                guard
                    let hash = try reader.nextHash({ field, value in
                        precondition(
                            field.count <= RedisReplyReader.maximumBulkLength
                                && value.count <= RedisReplyReader.maximumBulkLength)
                        pairs += 1
                    })
                else { return }
                if case .fields(let count) = hash {
                    precondition(count == pairs, "pairs counted \(count), handed \(pairs)")
                }
            } else {
                guard let reply = try reader.next() else { return }
                read(reply, askedAt: asked)
            }
        }
    }

    private static func read(_ reply: RedisReply, askedAt asked: RedisAddress) {
        if case .array(let ranges) = reply, ranges.contains(where: { !$0.elements.isEmpty }) {
            let map = RedisCluster.slotMap(reply, askedAt: asked)
            precondition(map.owners.count == RedisCluster.slotCount && map.masters.count <= RedisCluster.slotCount)
            precondition((map.owners.max() ?? -1) < map.masters.count, "a slot owned by a master not in the map")
            precondition(map.masters.allSatisfy { (1...65_535).contains($0.port) }, "a master at no port")
        }
        switch Redirection(reply, from: asked) {
        case .moved(let slot, let target)?:
            precondition((0..<RedisCluster.slotCount).contains(slot) && (1...65_535).contains(target.port))
        case .ask(let target)?:
            precondition((1...65_535).contains(target.port))
        case .tryAgain?, nil:
            break
        }
        if let master = RedisSentinels.namedMaster(in: reply) {
            precondition(
                (1...65_535).contains(master.port) && !master.host.isEmpty, "a sentinel's master at no address")
        }
        if case .error(let message) = reply { _ = RedisConnection.notServing(message) }
    }

    /// The answer as the tunnel reads it: up to the blank line, never past the size limit.
    static func proxy(_ bytes: [UInt8]) {
        var received: [UInt8] = []
        for byte in bytes {
            guard !ConnectAnswer.isComplete(received), received.count < ConnectAnswer.maximumSize else { break }
            received.append(byte)
        }
        switch ConnectAnswer(received) {
        case .tunnel:
            precondition(
                received.starts(with: Array("HTTP/1.".utf8)), "a tunnel opened on something else than HTTP/1.x")
        case .wantsCredentials(let shown), .refused(let shown):
            precondition(
                shown.unicodeScalars.count <= 120 && !shown.unicodeScalars.contains { $0.value < 0x20 },
                "a status line shown unbounded or with control characters")
        }
    }

    /// The first byte picks the answer (list, show, create's header, a refusal's body).
    static func channels(_ bytes: [UInt8]) {
        guard let first = bytes.first else { return }
        let body = Array(bytes.dropFirst())
        switch first % 4 {
        case 0:
            if let ids = try? APNsChannelAnswer.channels(body) {
                precondition(
                    ids.allSatisfy { (try? APNsChannelID.check($0)) != nil }, "a listed id that is no channel id")
            }
        case 1:
            _ = try? APNsChannelAnswer.storage(body)
        case 2:
            if let id = try? APNsChannelAnswer.createdChannel(String(decoding: body, as: UTF8.self)) {
                precondition((try? APNsChannelID.check(id)) != nil, "a created id that is no channel id")
            }
        default:
            _ = APNsChannelAnswer.refusal(status: Int(first), body: body)
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    FuzzedParser.chosen.run(data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? [])
    return 0
}

#if FUZZING
    // SwiftPM links an executable's entry point under the name `<module>_main`; built as a library (-parse-as-library)
    // for libFuzzer, this file provides it and hands control to libFuzzer's driver.
    @_silgen_name("LLVMFuzzerRunDriver")
    func runFuzzerDriver(
        _ argc: UnsafeMutablePointer<CInt>,
        _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
        _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
    ) -> CInt

    @_cdecl("fuzz_parsers_main")
    func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
        var count = argc
        var arguments = argv
        return runFuzzerDriver(&count, &arguments) { data, size in fuzzOneInput(data, size) }
    }
#endif
