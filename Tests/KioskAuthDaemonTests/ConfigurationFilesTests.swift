import Foundation
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

    @Test func onlyConfFilesAreRead() throws {
        let directory = try Directory(
            main: nil,
            dropIns: [
                "keep.conf": "[Daemon]\nLogLevel=debug\n",
                "skip.conf.orig": "[Daemon]\nLogLevel=error\n",
                "skip.conf~": "[Daemon]\nLogLevel=error\n",
                ".conf": "[Daemon]\nLogLevel=error\n",
                "README": "not a configuration file",
            ])
        let (configuration, warnings) = try directory.load()
        #expect(configuration.logLevel == "debug")
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

    @Test func aLargeFile_isReadWhole() throws {
        // Longer than one read: the key at the end still applies.
        let padding = String(repeating: "# padding line of a long comment block\n", count: 2_000)
        let directory = try Directory(main: "[Daemon]\n" + padding + "LogLevel=debug\n")
        let (configuration, _) = try directory.load()
        #expect(configuration.logLevel == "debug")
    }
}
