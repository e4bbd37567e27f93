import Foundation
import KioskAuthCore
import KioskAuthStore
import Logging
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Collects log messages so a test can see the development key's warning.
final class CollectingLogHandler: LogHandler, @unchecked Sendable {
    private let lock = NSLock()
    private var collected: [(Logger.Level, String)] = []
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        lock.withLock { collected.append((event.level, event.message.description)) }
    }

    var messages: [(Logger.Level, String)] { lock.withLock { collected } }
}

/// A directory laid out like the daemon's: a credentials directory and a state directory.
private struct KeyDirectories {
    let root: TemporaryDirectory
    let credentials: String
    let state: String

    init() throws {
        root = try TemporaryDirectory()
        credentials = root.file("credentials")
        state = root.file("state")
        try FileManager.default.createDirectory(atPath: credentials, withIntermediateDirectories: false)
        try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: false)
    }

    var credentialPath: String { credentials + "/" + StoreKeyLoader.credentialName }
    var developmentKeyPath: String { state + "/" + StoreKeyLoader.developmentKeyFileName }

    func writeCredential(_ bytes: [UInt8], mode: mode_t = 0o600) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: credentialPath))
        #expect(chmod(credentialPath, mode) == 0)
    }

    func load(
        credentialsDirectory: String? = nil, storeExists: Bool = false, allowDevelopmentKeyFile: Bool = false,
        logger: Logger = quietLogger
    ) throws -> (StoreKey, StoreKeySource) {
        try StoreKeyLoader.load(
            credentialsDirectory: credentialsDirectory, stateDirectory: state, storeExists: storeExists,
            allowDevelopmentKeyFile: allowDevelopmentKeyFile, logger: logger)
    }
}

private func mode(of path: String) -> mode_t? {
    var status = stat()
    guard stat(path, &status) == 0 else { return nil }
    return status.st_mode & 0o7777
}

private func contents(of path: String) throws -> [UInt8] { [UInt8](try Data(contentsOf: URL(fileURLWithPath: path))) }

/// Whether `key` opens the store at `fixture` (created under the fixture's own key).
private func opens(_ fixture: StoreFixture, with key: StoreKey) -> Bool {
    guard let store = try? fixture.open(with: key) else { return false }
    store.close()
    return true
}

@Suite("Loading the store key")
struct StoreKeyLoaderTests {
    @Test func credentialOfThirtyTwoBytes_isLoaded_asThoseBytes() throws {
        let directories = try KeyDirectories()
        let bytes = (0..<32).map { UInt8($0 * 7 + 3) }
        try directories.writeCredential(bytes)

        let (key, source) = try directories.load(credentialsDirectory: directories.credentials)

        #expect(source == .credential(path: directories.credentialPath))
        let fixture = try StoreFixture(key: try StoreKey(bytes: bytes))
        try fixture.withStore { _ in }
        #expect(opens(fixture, with: key))
        #expect(!opens(fixture, with: .random()))
    }

    @Test(arguments: [0, 16, 31, 33, 64])
    func credentialOfTheWrongSize_isRefused(size: Int) throws {
        let directories = try KeyDirectories()
        try directories.writeCredential([UInt8](repeating: 0x42, count: size))
        #expect(
            storeErrorCode { _ = try directories.load(credentialsDirectory: directories.credentials) }
                == .keyUnavailable)
    }

    @Test(arguments: [0o640, 0o604, 0o644, 0o660, 0o606] as [mode_t])
    func credentialReadableByGroupOrWorld_isRefused(mode: mode_t) throws {
        let directories = try KeyDirectories()
        try directories.writeCredential([UInt8](repeating: 0x42, count: 32), mode: mode)
        let error = #expect(throws: StoreError.self) {
            _ = try directories.load(credentialsDirectory: directories.credentials, allowDevelopmentKeyFile: true)
        }
        #expect(error?.code == .keyUnavailable)
        #expect(error?.message.contains("readable by others") == true)
        // Refused outright: no development key was made in its place.
        #expect(!FileManager.default.fileExists(atPath: directories.developmentKeyPath))
    }

    @Test(arguments: [0o400, 0o600] as [mode_t])
    func credentialReadableOnlyByItsOwner_isAccepted(mode: mode_t) throws {
        let directories = try KeyDirectories()
        try directories.writeCredential([UInt8](repeating: 0x42, count: 32), mode: mode)
        #expect(storeErrorCode { _ = try directories.load(credentialsDirectory: directories.credentials) } == nil)
    }

    @Test func credentialThatIsASymlink_isRefused() throws {
        let directories = try KeyDirectories()
        let target = directories.root.file("elsewhere.key")
        try Data(repeating: 0x42, count: 32).write(to: URL(fileURLWithPath: target))
        #expect(chmod(target, 0o600) == 0)
        try FileManager.default.createSymbolicLink(atPath: directories.credentialPath, withDestinationPath: target)
        #expect(
            storeErrorCode { _ = try directories.load(credentialsDirectory: directories.credentials) }
                == .keyUnavailable)
    }

    @Test func missingCredential_withoutTheDevelopmentFlag_namesCredentialsDirectory() throws {
        let directories = try KeyDirectories()
        for credentialsDirectory in [directories.credentials, nil] {
            let error = #expect(throws: StoreError.self) {
                _ = try directories.load(credentialsDirectory: credentialsDirectory)
            }
            #expect(error?.code == .keyUnavailable)
            #expect(error?.message.contains("$CREDENTIALS_DIRECTORY") == true)
            #expect(error?.message.contains(StoreKeyLoader.credentialName) == true)
        }
        #expect(!FileManager.default.fileExists(atPath: directories.developmentKeyPath))
    }

    @Test func developmentKeyFile_isCreatedOwnerOnly_andReusedNextTime() throws {
        let directories = try KeyDirectories()
        let (first, firstSource) = try directories.load(allowDevelopmentKeyFile: true)
        #expect(firstSource == .developmentKeyFile(path: directories.developmentKeyPath))
        #expect(mode(of: directories.developmentKeyPath) == 0o600)
        let written = try contents(of: directories.developmentKeyPath)
        #expect(written.count == 32)

        let fixture = try StoreFixture(key: first)
        try fixture.withStore { _ in }
        let (second, secondSource) = try directories.load(storeExists: true, allowDevelopmentKeyFile: true)
        #expect(secondSource == firstSource)
        #expect(try contents(of: directories.developmentKeyPath) == written)
        #expect(opens(fixture, with: second))
    }

    @Test func developmentKeyFile_comesWithALoudWarning() throws {
        let directories = try KeyDirectories()
        let handler = CollectingLogHandler()
        _ = try directories.load(allowDevelopmentKeyFile: true, logger: Logger(label: "test") { _ in handler })
        #expect(handler.messages.contains { $0.0 >= .warning && $0.1.contains("DEVELOPMENT KEY") })
    }

    @Test func developmentKeyFile_isNotCreated_whenAStoreAlreadyExists() throws {
        let directories = try KeyDirectories()
        let error = #expect(throws: StoreError.self) {
            _ = try directories.load(storeExists: true, allowDevelopmentKeyFile: true)
        }
        #expect(error?.code == .keyUnavailable)
        #expect(!FileManager.default.fileExists(atPath: directories.developmentKeyPath))
    }

    @Test func credential_winsOverADevelopmentKeyFile() throws {
        let directories = try KeyDirectories()
        _ = try directories.load(allowDevelopmentKeyFile: true)
        try directories.writeCredential([UInt8](repeating: 0x42, count: 32))
        let (_, source) = try directories.load(
            credentialsDirectory: directories.credentials, storeExists: true, allowDevelopmentKeyFile: true)
        #expect(source == .credential(path: directories.credentialPath))
    }

    @Test func developmentKeyFile_readableByOthers_isRefused() throws {
        let directories = try KeyDirectories()
        _ = try directories.load(allowDevelopmentKeyFile: true)
        #expect(chmod(directories.developmentKeyPath, 0o644) == 0)
        #expect(
            storeErrorCode { _ = try directories.load(storeExists: true, allowDevelopmentKeyFile: true) }
                == .keyUnavailable)
    }
}
