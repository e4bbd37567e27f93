import Foundation
import KioskAuthCore
import Testing

@testable import KioskAuthDaemon

/// Which files `DaemonConfiguration.load` reads, in which order, and what it refuses.
@Suite struct ConfigurationFilesTests {
    /// A fresh directory holding `kioskauthd.conf` (when `main` is given) and the drop-ins.
    final class Directory {
        let root: String
        var path: String { root + "/kioskauthd.conf" }
        var dropIns: String { path + ".d" }

        init(main: String?, dropIns: [String: String] = [:]) throws {
            root = FileManager.default.temporaryDirectory.appendingPathComponent("kioskauth-conf-\(UUID())").path
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            if let main { try main.write(toFile: path, atomically: true, encoding: .utf8) }
            if !dropIns.isEmpty {
                try FileManager.default.createDirectory(atPath: self.dropIns, withIntermediateDirectories: true)
                for (name, text) in dropIns {
                    try text.write(toFile: self.dropIns + "/" + name, atomically: true, encoding: .utf8)
                }
            }
        }

        deinit { try? FileManager.default.removeItem(atPath: root) }

        func load() throws(DaemonConfiguration.ParseError) -> (DaemonConfiguration, [String]) {
            var warnings: [String] = []
            let configuration = try DaemonConfiguration.load(path: path) { warnings.append($0) }
            return (configuration, warnings)
        }
    }

    @Test func noFileAtAll_isTheEmbeddedDefaults() throws {
        let directory = try Directory(main: nil)
        let (configuration, warnings) = try directory.load()
        #expect(configuration.logLevel == DaemonConfiguration().logLevel)
        #expect(warnings.isEmpty)
    }

    @Test func dropIns_applyAfterTheMainFile_inTheByteOrderOfTheirNames() throws {
        // Byte order puts "Z" before "a" and "10" before "9"; a locale-aware order would not.
        let directory = try Directory(
            main: "[Daemon]\nLogLevel=error\nIdleReleaseSec=5\n",
            dropIns: [
                "a.conf": "[Daemon]\nLogLevel=debug\n",
                "Z.conf": "[Daemon]\nLogLevel=notice\nIdleReleaseSec=7\n",
                "10-first.conf": "[Daemon]\nIdleReleaseSec=9\n",
                "9-second.conf": "[Daemon]\nIdleReleaseSec=11\n",
            ])
        let (configuration, _) = try directory.load()
        #expect(configuration.logLevel == "debug")  // a.conf is last
        #expect(configuration.idleRelease == 7)  // Z.conf comes after 10-first and 9-second
    }

    /// Swift orders Strings by canonical equivalence: a name with a decomposed é (`e` and U+0301)
    /// sorts as the precomposed é would, after `f`; its bytes (0x65 …) sort before `f` (0x66),
    /// which is where systemd (strcmp) puts it.
    @Test func dropIns_areOrderedByBytes_notByCanonicalEquivalence() throws {
        let directory = try Directory(
            main: nil,
            dropIns: ["e\u{301}.conf": "[Daemon]\nLogLevel=error\n", "f.conf": "[Daemon]\nLogLevel=debug\n"])
        let (configuration, _) = try directory.load()
        #expect(configuration.logLevel == "debug")
    }

    @Test func onlyConfFilesAreRead() throws {
        let directory = try Directory(
            main: nil,
            dropIns: [
                "keep.conf": "[Daemon]\nLogLevel=debug\n",
                "skip.conf.orig": "[Daemon]\nLogLevel=error\n",
                "skip.conf~": "[Daemon]\nLogLevel=error\n",
                // Hidden names are skipped, as systemd skips them (an editor's lock file, say);
                // these sort after keep.conf and set what nothing else sets.
                ".conf": "[Daemon]\nIdleReleaseSec=5\n",
                ".~lock.z.conf": "[Daemon]\nIdleReleaseSec=6\n",
                "README": "not a configuration file",
                "zz.conf.d": "[Daemon]\nIdleReleaseSec=7\n",
            ])
        let (configuration, warnings) = try directory.load()
        #expect(configuration.logLevel == "debug")
        #expect(configuration.idleRelease == DaemonConfiguration().idleRelease)
        #expect(warnings.isEmpty)
    }

    @Test func aDropInPathThatIsNotADirectory_isRefused_notSkipped() throws {
        let directory = try Directory(main: "[Daemon]\nLogLevel=debug\n")
        try "[Access]\nPasscodeServices=\n".write(toFile: directory.dropIns, atomically: true, encoding: .utf8)
        let error = #expect(throws: DaemonConfiguration.ParseError.self) { try directory.load() }
        #expect(error?.file == directory.dropIns)
        #expect(error?.message == "cannot list: Not a directory")
    }

    @Test func aDropInThatCannotBeRead_isRefused() throws {
        let directory = try Directory(main: nil, dropIns: ["a.conf": "[Daemon]\nLogLevel=debug\n"])
        try FileManager.default.createDirectory(
            atPath: directory.dropIns + "/b.conf", withIntermediateDirectories: false)
        let error = #expect(throws: DaemonConfiguration.ParseError.self) { try directory.load() }
        #expect(error?.file == directory.dropIns + "/b.conf")
        #expect(error?.message == "cannot read: Is a directory")
    }

    @Test func aFileThatIsNotUTF8_isRefused() throws {
        let directory = try Directory(main: nil)
        try Data([0x5B, 0x44, 0x61, 0x65, 0x6D, 0x6F, 0x6E, 0x5D, 0x0A, 0xFF, 0xFE, 0x0A]).write(
            to: URL(fileURLWithPath: directory.path))
        let error = #expect(throws: DaemonConfiguration.ParseError.self) { try directory.load() }
        #expect(error?.file == directory.path)
        #expect(error?.message == "cannot read: not UTF-8 text")
    }

    @Test func aLeadingByteOrderMark_isDropped() throws {
        let directory = try Directory(main: nil)
        try Data([0xEF, 0xBB, 0xBF] + Array("[Daemon]\nLogLevel=debug\n".utf8)).write(
            to: URL(fileURLWithPath: directory.path))
        let (configuration, warnings) = try directory.load()
        #expect(configuration.logLevel == "debug")
        #expect(warnings.isEmpty)
    }

    @Test func aDropInWhoseNameIsNotUTF8_isRefused() throws {
        let directory = try Directory(main: nil, dropIns: ["a.conf": "[Daemon]\nLogLevel=debug\n"])
        let name = Array((directory.dropIns + "/b").utf8) + [0xFF] + Array(".conf".utf8) + [0]
        let fd = name.withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { open($0.baseAddress!, O_WRONLY | O_CREAT | O_EXCL, 0o600) }
        }
        #expect(fd >= 0)
        close(fd)
        let error = #expect(throws: DaemonConfiguration.ParseError.self) { try directory.load() }
        #expect(error?.message == "cannot read: the name is not UTF-8")
    }

    @Test func aMainFileThatCannotBeLookedAt_isRefused_notTakenAsAbsent() throws {
        let directory = try Directory(main: nil)
        try FileManager.default.createSymbolicLink(atPath: directory.path, withDestinationPath: directory.path)
        let error = #expect(throws: DaemonConfiguration.ParseError.self) { try directory.load() }
        #expect(error?.file == directory.path)
        #expect(error?.message == "cannot read: Too many levels of symbolic links")
    }

    @Test func aLargeFile_isReadWhole() throws {
        // Longer than one read: the key at the end still applies.
        let padding = String(repeating: "# padding line of a long comment block\n", count: 2_000)
        let directory = try Directory(main: "[Daemon]\n" + padding + "LogLevel=debug\n")
        let (configuration, _) = try directory.load()
        #expect(configuration.logLevel == "debug")
    }
}

/// `SystemAccounts.system` reads login.defs as bytes: text that is not UTF-8 elsewhere in the
/// file must not hide `SYS_UID_MAX` (and so make uids below it bindable).
@Suite struct LoginDefsReadingTests {
    @Test func aLatin1ByteInAComment_doesNotHideTheSetting() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("login.defs-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        try Data(Array("# Voreinstellungen f".utf8) + [0xFC] + Array("r Benutzer\nSYS_UID_MAX 1999\n".utf8)).write(
            to: URL(fileURLWithPath: path))
        let accounts = SystemAccounts.system(loginDefs: path)
        #expect(accounts.systemUIDMax == 1999)
        // What it decides: binding uid 1500 is refused as a system uid.
        #expect(AccountBinding.uidRefusal(1500, systemUIDMax: accounts.systemUIDMax) != nil)
        #expect(AccountBinding.uidRefusal(2000, systemUIDMax: accounts.systemUIDMax) == nil)
    }
}
