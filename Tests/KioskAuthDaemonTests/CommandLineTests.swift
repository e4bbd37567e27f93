import Testing

@testable import KioskAuthDaemon

/// kioskauthd's own command-line parser: the options kioskauthd(8) documents, in both GNU forms,
/// and a named usage error (exit status 64 in the program) for everything else.
@Suite("kioskauthd command line")
struct CommandLineTests {
    private func run(_ arguments: [String]) throws -> DaemonCommandLine {
        guard case .run(let parsed) = try DaemonCommandLine.parse(arguments) else {
            Issue.record("\(arguments) did not ask to run")
            return DaemonCommandLine()
        }
        return parsed
    }

    private func usageError(_ arguments: [String]) -> String? {
        do {
            _ = try DaemonCommandLine.parse(arguments)
            return nil
        } catch {
            return error.message
        }
    }

    @Test func noArguments_runWithTheDefaults() throws {
        #expect(try run([]) == DaemonCommandLine())
    }

    @Test func everyOption_inBothForms() throws {
        let separate = try run([
            "--config", "/etc/k.conf", "--state-directory", "/s", "--runtime-directory", "/r", "--socket", "/r/sock",
            "--log-level", "debug", "--development-key-file", "--accept-store-rollback",
        ])
        let joined = try run([
            "--config=/etc/k.conf", "--state-directory=/s", "--runtime-directory=/r", "--socket=/r/sock",
            "--log-level=debug", "--development-key-file", "--accept-store-rollback",
        ])
        var expected = DaemonCommandLine()
        expected.config = "/etc/k.conf"
        expected.stateDirectory = "/s"
        expected.runtimeDirectory = "/r"
        expected.socket = "/r/sock"
        expected.logLevel = "debug"
        expected.developmentKeyFile = true
        expected.acceptStoreRollback = true
        #expect(separate == expected)
        #expect(joined == expected)
        // A value may contain '=' and may look like an option when joined.
        #expect(try run(["--config=/a=b"]).config == "/a=b")
        #expect(try run(["--socket=--odd"]).socket == "--odd")
        #expect(try run(["--config", "/c", "--"]).config == "/c")
    }

    @Test func helpAndVersion_winOnceTheArgumentsBeforeThemParse() throws {
        #expect(try DaemonCommandLine.parse(["--help"]) == .help)
        #expect(try DaemonCommandLine.parse(["-h"]) == .help)
        #expect(try DaemonCommandLine.parse(["--version"]) == .version)
        #expect(try DaemonCommandLine.parse(["--config", "/c", "--version"]) == .version)
        #expect(usageError(["--bogus", "--version"]) == "unknown option '--bogus'")
    }

    @Test func badCommandLines_areNamedUsageErrors() {
        #expect(usageError(["--bogus"]) == "unknown option '--bogus'")
        #expect(usageError(["-c", "/c"]) == "unexpected argument '-c'")
        #expect(usageError(["extra"]) == "unexpected argument 'extra'")
        #expect(usageError(["--"]) == nil)
        #expect(usageError(["--", "extra"]) == "unexpected argument 'extra'")
        #expect(usageError(["--config"]) == "missing value for '--config <file>'")
        #expect(usageError(["--config", "--socket", "/s"]) == "missing value for '--config <file>'")
        #expect(usageError(["--config="]) == "empty value for '--config'")
        #expect(usageError(["--development-key-file=yes"]) == "option '--development-key-file' takes no value")
        #expect(usageError(["--socket", "/a", "--socket", "/b"]) == "option '--socket' given more than once")
        #expect(
            usageError(["--log-level", "loud"])
                == "unknown log level loud (one of: trace, debug, info, notice, warning, error, critical)")
        #expect(usageError(["--log-level", "info"]) == nil)
        #expect(usageError(["--config", "-x"]) == "missing value for '--config <file>'")
        #expect(usageError(["--config", ""]) == "empty value for '--config'")
        #expect(
            usageError(["--development-key-file", "--development-key-file"])
                == "option '--development-key-file' given more than once")
        #expect(usageError(["--help=please"]) == "option '--help' takes no value")
        #expect(usageError(["--version=1"]) == "option '--version' takes no value")
        // The value after '=' keeps a combining mark that follows it.
        #expect(usageError(["--development-key-file=\u{301}"]) == "option '--development-key-file' takes no value")
        #expect((try? run(["--socket=\u{301}x"]))?.socket == "\u{301}x")
    }

    /// An option added to the table without its own help line would show `--help`'s: every
    /// option's line is its own.
    @Test func theHelp_givesEveryOptionALineOfItsOwn() {
        let lines = DaemonCommandLine.help.split(separator: "\n").filter { $0.hasPrefix("      ") }
        #expect(lines.count == 9)
        #expect(Set(lines).count == lines.count, "two options share a help line: \(lines)")
        #expect(DaemonCommandLine.help.contains("trace, debug, info, notice, warning, error, critical"))
    }

    @Test func theHelp_namesEveryOption() {
        for option in [
            "--config", "--state-directory", "--runtime-directory", "--socket", "--development-key-file",
            "--accept-store-rollback", "--log-level", "--version", "--help",
        ] {
            #expect(DaemonCommandLine.help.contains(option), "\(option) missing from --help")
        }
    }
}
