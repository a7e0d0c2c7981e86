// swift-tools-version:6.0
import PackageDescription

// Dependency edges, bottom to top:
//   C modules (one per library) -> wrappers (AMQP, Redis, HTTP2, APNs) -> WorkerPipeline (the pipeline and its
//   ports) -> adapters (AMQPBroker, RedisStore) -> Configuration (settings, wiring) -> Operations -> executables.
// Only the wrapper modules import the C modules, with `internal import`, so no C pointer reaches the pipeline.
// The modules a notification passes through. In release builds they skip Swift's dynamic exclusivity checks
// (swift_beginAccess on every class property touched per stream, a large share of a notification's instructions in
// scripts/profile), are optimized across modules (-cross-module-optimization: a caller inlines and specializes the
// small functions and generics of the modules below it, where it called them through their public entry points), and
// inline more: generic functions too (-sil-inline-generics, which Swift's optimizer leaves off by default), and LLVM
// up to a larger cost (-inline-threshold=500 against its 225). About 1,300 instructions a single-token job in
// scripts/profile, the binary 1% larger. The -Xllvm options belong to this toolchain (Swift 6.3).
// Debug builds, which the tests and the sanitizers run, keep the checks.
let releaseHotPath = [
    "-enforce-exclusivity=unchecked", "-cross-module-optimization",
    "-Xllvm", "-sil-inline-generics", "-Xllvm", "-inline-threshold=500",
]
let hotPath: [SwiftSetting] = [.unsafeFlags(releaseHotPath, .when(configuration: .release))]
// Those of them that hold no C handle and no pointer past a closure's scope, and whose classes have no deinit (the
// vocabulary, the JSON reader, the pipeline, the adapters), also give up lexical lifetimes in release builds: an
// object may be released after its last use rather than at the end of its variable's scope, which lets the optimizer
// remove retain and release pairs: about 700 instructions a single-token job in scripts/profile. A wrapper keeps
// them: there an object's lifetime is what keeps alive the C handle that a raw pointer taken from it refers to.
let pureHotPath: [SwiftSetting] = [
    .unsafeFlags(releaseHotPath + ["-Xfrontend", "-enable-lexical-lifetimes=false"], .when(configuration: .release))
]

// Release builds of the worker (and of apns-sim, below) allocate with mimalloc (Debian's libmimalloc-dev), which
// replaces malloc and free for the whole process: a single-token job allocates about eight objects and frees them a
// batch later, a pattern that sends glibc's allocator past its per-thread cache into its slower bins (about 3,000
// instructions a job in scripts/profile). Debug builds, which the tests and the sanitizers run, keep glibc's: a
// sanitizer brings its own allocator.
let mimalloc: [LinkerSetting] = [.linkedLibrary("mimalloc", .when(configuration: .release))]

let package = Package(
    name: "apns-worker",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "apns-worker", targets: ["apns-worker"]),
        .executable(name: "apns-sim", targets: ["apns-sim"])
    ],
    targets: [
        // C libraries from Debian packages. Each module map's header also holds the few static inline shims
        // for what Swift cannot import (variadic functions, function-like macros), so every C type has one home.
        .systemLibrary(
            name: "CRabbitMQ", path: "Sources/CRabbitMQ", pkgConfig: "librabbitmq",
            providers: [.apt(["librabbitmq-dev"])]),
        // No pkgConfig: hiredis.pc's -D_FILE_OFFSET_BITS=64 is a flag SwiftPM refuses in a dependency.
        .systemLibrary(
            name: "CNghttp2", path: "Sources/CNghttp2", pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]),
        .systemLibrary(
            name: "COpenSSL", path: "Sources/COpenSSL", pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]),

        // Strict JSON reading (byte ranges kept, depth bounded) and string quoting: jobs, events, answers, logs.
        .target(name: "JSON", swiftSettings: pureHotPath),
        // Threads and their tools: a lock, a wake-up a poll loop waits on, bulk threads' lower priority, reconnects'
        // back-off.
        .target(name: "Threads", swiftSettings: hotPath),
        // The URLs services are named by (amqp://, redis://, https://), and percent-encoding.
        .target(name: "ServiceURLs"),
        // Logs, metrics text, the health endpoint, and the runner of a service's process.
        .target(name: "Telemetry", dependencies: ["JSON", "Threads"], swiftSettings: hotPath),
        .target(
            name: "AMQP", dependencies: ["CRabbitMQ", "ServiceURLs", "Telemetry", "Threads"], swiftSettings: hotPath),
        .target(name: "TLS", dependencies: ["COpenSSL", "Telemetry"], swiftSettings: hotPath),
        .target(name: "Redis", dependencies: ["TLS", "ServiceURLs", "Telemetry", "Threads"], swiftSettings: hotPath),
        .target(
            name: "HTTP2", dependencies: ["CNghttp2", "COpenSSL", "TLS", "ServiceURLs", "Telemetry", "Threads"],
            swiftSettings: hotPath),
        // Apple's vocabulary and rules: notifications, the routes APNs takes and what their answers mean, reasons;
        // and the two lanes work travels in, which the client and the pipeline share. No connection.
        .target(name: "APNsModel", dependencies: ["JSON"], swiftSettings: pureHotPath),
        // The APNs client: connections, provider tokens, certificates (re-exports APNsModel).
        .target(
            name: "APNs", dependencies: ["APNsModel", "HTTP2", "TLS", "COpenSSL", "JSON", "Telemetry", "Threads"],
            swiftSettings: hotPath),
        .target(name: "APNsSimulator", dependencies: ["HTTP2", "APNs", "JSON", "Telemetry", "Threads"]),
        // The pipeline speaks to the broker, the stores and APNs through protocols of its own (Ports.swift): it imports
        // neither AMQP, Redis nor HTTP/2, and nothing that opens a connection.
        .target(
            name: "WorkerPipeline", dependencies: ["APNsModel", "JSON", "Telemetry", "Threads"],
            swiftSettings: pureHotPath),
        // Adapters: the pipeline's ports over RabbitMQ, Redis and APNs.
        .target(
            name: "AMQPBroker", dependencies: ["AMQP", "APNsModel", "WorkerPipeline", "Telemetry", "Threads"],
            swiftSettings: pureHotPath),
        .target(
            name: "RedisStore",
            dependencies: [
                "Redis", "WorkerPipeline", "APNs", "APNsModel", "JSON", "ServiceURLs",
                "Telemetry", "Threads"
            ],
            swiftSettings: pureHotPath),
        // The pipeline's sender port over the APNs client.
        .target(
            name: "APNsSender", dependencies: ["APNs", "HTTP2", "WorkerPipeline", "Telemetry", "Threads"],
            swiftSettings: pureHotPath),
        // Settings from the environment, a file and flags, mapped to each part's typed values; and the wiring of a
        // worker from them.
        .target(
            name: "Configuration",
            dependencies: [
                "AMQP", "AMQPBroker", "Redis", "RedisStore", "APNs", "APNsSender",
                "TLS", "WorkerPipeline", "Telemetry"
            ]),
        // What operators and backends run beside the workers: enqueue, tokens, stats, dead-tokens tail, cleanup.
        .target(
            name: "Operations",
            dependencies: [
                "Configuration", "WorkerPipeline", "AMQPBroker", "RedisStore", "AMQP",
                "Redis", "APNs", "JSON", "Telemetry", "Threads"
            ]),

        // Argument parsing and help over Operations and Configuration: no connection is made here.
        .executableTarget(
            name: "apns-worker",
            dependencies: [
                "Operations", "Configuration", "WorkerPipeline", "APNs",
                "Redis", "JSON", "Telemetry"
            ],
            linkerSettings: mimalloc),
        // apns-sim too: it shares the benchmarks' cores with the worker and the broker, where APNs has its own.
        .executableTarget(
            name: "apns-sim", dependencies: ["APNsSimulator", "HTTP2", "TLS", "APNs", "Telemetry"],
            linkerSettings: mimalloc),
        .executableTarget(name: "apns-bench", dependencies: ["AMQP", "APNs", "HTTP2", "Telemetry", "Threads"]),
        // libFuzzer targets over the parsers of bytes from outside (scripts/fuzz builds it with -sanitize=fuzzer).
        .executableTarget(
            name: "fuzz-parsers",
            dependencies: [
                "APNs", "Configuration", "HTTP2", "Redis", "WorkerPipeline",
                "JSON"
            ]),

        .testTarget(
            name: "UnitTests",
            dependencies: [
                "APNs", "HTTP2", "WorkerPipeline", "Configuration", "Operations",
                "AMQP", "AMQPBroker", "Redis", "RedisStore", "TLS", "JSON",
                "ServiceURLs", "Telemetry", "Threads", "COpenSSL", "APNsSimulator"
            ]),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "APNs", "APNsSimulator", "HTTP2", "WorkerPipeline", "AMQPBroker", "RedisStore",
                "Configuration", "Operations", "AMQP", "Redis", "TLS", "JSON", "ServiceURLs",
                "Telemetry", "Threads"
            ])
    ],
    swiftLanguageModes: [.v6]
)
