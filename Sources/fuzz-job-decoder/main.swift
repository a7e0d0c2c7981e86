import APNs
import WorkerPipeline

// A coverage-guided fuzz target (libFuzzer) over everything a message from outside goes through: the job decoder
// and its retry form, registration and dead-token events. Built and run by scripts/fuzz:
//   swift build --product fuzz-job-decoder -Xswiftc -sanitize=fuzzer,address -Xswiftc -parse-as-library
// Built normally, it is an empty program (libFuzzer supplies `main` when fuzzing).

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    if let job = try? PushJob.decode(bytes, defaultTopic: "com.example.app", fallbackID: "fuzz") {
        // What is accepted must be actionable, and its retry form must read back the same.
        let targets = job.retryTargets?.count ?? (job.users.count + job.tokens.count)
        precondition(targets > 0 && !job.topic.isEmpty && job.payload.count <= job.pushType.maximumPayloadSize,
                     "an accepted job without targets, topic or a valid payload")
        if let retryTargets = job.retryTargets {
            let again = try? PushJob.decode(job.retryBody(targets: retryTargets, original: bytes), defaultTopic: nil,
                                            fallbackID: "")
            precondition(again?.retryTargets == retryTargets && again?.payload == job.payload
                         && again?.originalBody == (job.originalBody ?? bytes), "retry round trip")
        }
    }
    if let event = try? RegistrationEvent.decode(bytes, now: 1) {
        precondition((try? RegistrationEvent.decode(event.json, now: 1)) == event, "registration round trip")
    }
    _ = try? DeadTokenEvent.decode(bytes)
    _ = APNsResponse.parseBody(bytes)
    return 0
}

#if FUZZING
// SwiftPM links an executable's entry point under the name `<module>_main`; built as a library (-parse-as-library)
// for libFuzzer, this file provides it and hands control to libFuzzer's driver.
@_silgen_name("LLVMFuzzerRunDriver")
func runFuzzerDriver(_ argc: UnsafeMutablePointer<CInt>,
                     _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
                     _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt) -> CInt

@_cdecl("fuzz_job_decoder_main")
func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var count = argc
    var arguments = argv
    return runFuzzerDriver(&count, &arguments) { data, size in fuzzOneInput(data, size) }
}
#endif
