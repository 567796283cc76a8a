// swift-tools-version:6.0
import PackageDescription

/// Settings shared by every Swift target.
let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "Marquee",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "marquee", targets: ["marquee"])
    ],
    targets: [
        // MARK: C libraries from Debian
        .systemLibrary(
            name: "CLibPQ",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]
        ),
        .systemLibrary(
            name: "COpenSSL",
            pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]
        ),
        .systemLibrary(
            name: "CNGHTTP2",
            pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]
        ),
        // glibc's malloc.h (mallopt), which Swift's Glibc module does not include.
        .systemLibrary(name: "CMalloc"),
        .systemLibrary(
            name: "CMicroHTTPD",
            pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"])]
        ),

        // MARK: Wire-level modules (know nothing of Marquee)
        .target(name: "PostgresClient", dependencies: ["CLibPQ"], swiftSettings: swiftSettings),
        .target(name: "HTTPServer", dependencies: ["CMicroHTTPD"], swiftSettings: swiftSettings),
        .target(name: "JSON", swiftSettings: swiftSettings),
        .target(name: "Crypto", dependencies: ["COpenSSL", "JSON"], swiftSettings: swiftSettings),
        .target(name: "HTTP2", dependencies: ["CNGHTTP2", "COpenSSL"], swiftSettings: swiftSettings),
        .target(name: "Observability", swiftSettings: swiftSettings),
        .target(name: "ProcessLifecycle", dependencies: ["Observability"], swiftSettings: swiftSettings),

        // MARK: Marquee
        .target(name: "MarqueeCore", dependencies: ["JSON", "Crypto"], swiftSettings: swiftSettings),
        .target(
            name: "MarqueeStore",
            dependencies: ["MarqueeCore", "PostgresClient", "Crypto"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "MarqueeAPI",
            dependencies: ["MarqueeCore", "MarqueeStore", "HTTPServer", "Observability", "PostgresClient", "Crypto"],
            // The README's pictures of the console, taken by its browser tests; the console itself is Swift source.
            exclude: ["Console/screenshots"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "MarqueeDelivery",
            dependencies: ["MarqueeCore", "MarqueeStore", "HTTP2", "Crypto", "Observability", "PostgresClient"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "MarqueeSimulators", dependencies: ["HTTP2", "Crypto", "MarqueeCore"], swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "marquee",
            dependencies: [
                "MarqueeCore", "MarqueeStore", "MarqueeAPI", "PostgresClient", "HTTPServer", "Crypto",
                "Observability", "ProcessLifecycle", "MarqueeDelivery", "HTTP2", "MarqueeSimulators", "CMalloc",
            ],
            swiftSettings: swiftSettings
        ),

        // MARK: Benchmarks (drivers for bench/*/run.sh)
        .executableTarget(
            name: "marquee-bench",
            dependencies: ["PostgresClient", "MarqueeDelivery", "MarqueeCore", "Crypto"],
            path: "bench/Sources/marquee-bench",
            swiftSettings: swiftSettings
        ),

        // MARK: Tests
        // Mirrors of the device libraries' Codable types, shared by the payload and end-to-end tests.
        .target(name: "ClientMirrors", path: "Tests/ClientMirrors", swiftSettings: swiftSettings),
        .testTarget(name: "PostgresClientTests", dependencies: ["PostgresClient"], swiftSettings: swiftSettings),
        .testTarget(name: "HTTPServerTests", dependencies: ["HTTPServer"], swiftSettings: swiftSettings),
        .testTarget(name: "CryptoTests", dependencies: ["Crypto"], swiftSettings: swiftSettings),
        .testTarget(name: "HTTP2Tests", dependencies: ["HTTP2", "Crypto"], swiftSettings: swiftSettings),
        .testTarget(name: "ObservabilityTests", dependencies: ["Observability"], swiftSettings: swiftSettings),
        .testTarget(
            name: "MarqueeDeliveryTests",
            dependencies: [
                "MarqueeDelivery", "MarqueeCore", "MarqueeStore", "Observability", "HTTP2", "Crypto", "PostgresClient",
            ],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "ProcessLifecycleTests", dependencies: ["ProcessLifecycle", "Observability"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "MarqueeAPITests",
            dependencies: ["MarqueeAPI", "MarqueeCore", "MarqueeStore", "HTTPServer", "Observability"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "MarqueeStoreTests", dependencies: ["MarqueeStore", "MarqueeCore", "PostgresClient"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "MarqueeCoreTests", dependencies: ["MarqueeCore", "JSON", "ClientMirrors", "CMalloc"],
            exclude: ["Golden"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "MarqueeSimulatorsTests", dependencies: ["MarqueeSimulators", "HTTP2", "Crypto", "MarqueeCore"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "MarqueeCore", "MarqueeStore", "MarqueeAPI", "PostgresClient", "HTTPServer", "Observability", "Crypto",
                "MarqueeSimulators", "MarqueeDelivery", "HTTP2", "ClientMirrors",
            ],
            swiftSettings: swiftSettings
        ),
    ]
)
