// swift-tools-version:6.1
import PackageDescription

// Every module opts into the same strictness: existentials are spelled `any`, and imports are
// internal unless a module deliberately re-exports a type in its public face.
let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

// Where libfprint's and GLib's headers are: the directories of `pkg-config --cflags libfprint-2`
// on Debian that its headers need. CFPrint includes them but links nothing, for libfprint is
// loaded when the reader starts (Sources/CFPrint/include/CFPrint.h), and a system-library target
// with pkg-config would also link it. GLib's configuration header is in the architecture's own
// library directory: DEB_HOST_MULTIARCH when the package is built (debian/rules), else this
// machine's.
let multiarch: String = {
    if let named = Context.environment["DEB_HOST_MULTIARCH"], !named.isEmpty { return named }
    #if arch(x86_64)
        return "x86_64-linux-gnu"
    #elseif arch(arm64)
        return "aarch64-linux-gnu"
    #elseif arch(arm)
        return "arm-linux-gnueabihf"
    #elseif arch(i386)
        return "i386-linux-gnu"
    #elseif arch(powerpc64le)
        return "powerpc64le-linux-gnu"
    #elseif arch(s390x)
        return "s390x-linux-gnu"
    #elseif arch(riscv64)
        return "riscv64-linux-gnu"
    #else
        fatalError("kioskauth: no Debian multiarch name known for this architecture; set DEB_HOST_MULTIARCH")
    #endif
}()
let libfprintIncludes = [
    "-I/usr/include/libfprint-2", "-I/usr/include/glib-2.0", "-I/usr/lib/\(multiarch)/glib-2.0/include",
]
let importsLibfprint: [SwiftSetting] = [.unsafeFlags(libfprintIncludes.flatMap { ["-Xcc", $0] })]

let package = Package(
    name: "kioskauth",
    products: [
        .executable(name: "kioskauthd", targets: ["kioskauthd"]),
        .executable(name: "kioskauthctl", targets: ["kioskauthctl"]),
        .executable(name: "kioskauth-fleet", targets: ["kioskauth-fleet"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
    ],
    targets: [
        // C interop, each behind exactly one module.
        .target(name: "CKioskAuthSystem"),
        .systemLibrary(name: "CSQLite3", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CArgon2", pkgConfig: "libargon2", providers: [.apt(["libargon2-dev"])]),
        // libfprint's and GLib's headers, and the loader that reaches their functions.
        .target(name: "CFPrint", cSettings: [.unsafeFlags(libfprintIncludes)]),

        // The domain: people, credentials, policies and the decision state machines. No I/O.
        .target(name: "KioskAuthCore", swiftSettings: strictSettings),

        // The sealed SQLite store.
        .target(
            name: "KioskAuthStore",
            dependencies: [
                "KioskAuthCore", "CSQLite3", "CArgon2",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings),

        // Varlink framing, the interface description and typed errors; shared by daemon and CLI.
        // The interface description is embedded in the code, so the installed binary needs no bundle.
        .target(
            name: "KioskAuthProtocol", resources: [.embedInCode("io.kioskauth.varlink")],
            swiftSettings: strictSettings),

        // The only code that touches libfprint.
        .target(
            name: "KioskAuthFingerprint",
            dependencies: [
                "CFPrint",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings + importsLibfprint),

        // OAuth 2.0 / OpenID Connect client and the audit endpoint's client, over one HTTP
        // transport (async-http-client on NIO, BoringSSL from swift-nio-ssl; docs/footprint.md).
        // It reads JSON with the protocol's strict parser.
        .target(
            name: "KioskAuthIdentity",
            dependencies: [
                "KioskAuthProtocol",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings),

        // The fleet's side of a terminal that needs no database client (docs/fleet.md): keys and
        // their wrapping, sealing, row MACs, the operations and changes a terminal exchanges with
        // the directory, and `FleetDirectoryConnection`, what the daemon asks of a connection.
        .target(
            name: "KioskAuthFleet",
            dependencies: [
                "KioskAuthCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings),

        // The fleet directory on PostgreSQL: the schema and its migrations, and `FleetDirectory`,
        // a `FleetDirectoryConnection` over postgres-nio (which brings Foundation and ICU).
        .target(
            name: "KioskAuthFleetDirectory",
            dependencies: [
                "KioskAuthFleet", "KioskAuthCore",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings),

        // The long-lived services, the socket server and caller authorisation.
        .target(
            name: "KioskAuthDaemon",
            dependencies: [
                "KioskAuthCore", "KioskAuthStore", "KioskAuthProtocol", "KioskAuthFingerprint",
                "KioskAuthIdentity", "KioskAuthFleet", "CKioskAuthSystem",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: strictSettings),

        .executableTarget(
            name: "kioskauthd",
            dependencies: [
                "KioskAuthDaemon", "KioskAuthProtocol",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings),
        // The fleet helper: the directory client in a process of its own, started by kioskauthd
        // (docs/fleet.md §10), so postgres-nio, Foundation and ICU stay out of the daemon.
        .executableTarget(
            name: "kioskauth-fleet",
            dependencies: [
                "KioskAuthFleetDirectory", "KioskAuthFleet", "CKioskAuthSystem",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings),
        .executableTarget(
            name: "kioskauthctl",
            dependencies: [
                "KioskAuthCore", "KioskAuthProtocol", "CKioskAuthSystem",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strictSettings),

        .testTarget(name: "KioskAuthCoreTests", dependencies: ["KioskAuthCore"]),
        .testTarget(
            name: "KioskAuthStoreTests",
            dependencies: [
                "KioskAuthStore", "KioskAuthCore", "CSQLite3",
                .product(name: "Logging", package: "swift-log"),
            ]),
        .testTarget(name: "KioskAuthProtocolTests", dependencies: ["KioskAuthProtocol"]),
        .testTarget(
            name: "KioskAuthDaemonTests",
            dependencies: [
                "KioskAuthDaemon", "KioskAuthCore", "KioskAuthStore", "KioskAuthProtocol", "CKioskAuthSystem",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]),
        .testTarget(
            name: "KioskAuthFingerprintTests",
            dependencies: ["KioskAuthFingerprint", "CFPrint", .product(name: "Logging", package: "swift-log")],
            swiftSettings: importsLibfprint),
        .testTarget(
            name: "KioskAuthIdentityTests",
            dependencies: [
                "KioskAuthIdentity", "KioskAuthProtocol",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        .testTarget(
            name: "KioskAuthFleetTests",
            dependencies: [
                "KioskAuthFleet", "KioskAuthFleetDirectory",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]),
    ]
)
