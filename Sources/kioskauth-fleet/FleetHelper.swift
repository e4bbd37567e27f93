import Dispatch
import KioskAuthFleet
import KioskAuthFleetDirectory
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// `kioskauth-fleet`: the fleet directory's client, in a process of its own. kioskauthd starts it
/// with one end of a socket pair as its standard input and asks it for directory operations
/// (docs/fleet.md §9.11); it exits when the daemon closes that socket or goes away. Not run by hand.
@main
struct FleetHelperMain {
    /// Not `async`, as kioskauthd's: an async `main` hands the main thread to `dispatch_main`,
    /// which ends it with `pthread_exit`, unwinding its stack through the unwind tables (a
    /// megabyte resident for nothing, and a process valgrind cannot follow).
    static func main() {
        var arguments = CommandLine.arguments.dropFirst()
        var level = Logger.Level.info
        var wire: String?
        while let argument = arguments.popFirst() {
            switch argument {
            case "--log-level":
                guard let value = arguments.popFirst(), let parsed = Logger.Level(rawValue: value) else {
                    fail("--log-level needs one of: \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                level = parsed
            case "--wire":
                wire = arguments.popFirst()
            default:
                fail("unknown argument \(argument)")
            }
        }
        // A daemon of another build (the package was upgraded under a running one) speaks
        // another wire: refuse it rather than misread it.
        guard wire == FleetWire.version else {
            fail("started with wire version \(wire ?? "none"), this build speaks \(FleetWire.version)")
        }
        var status = stat()
        guard fstat(0, &status) == 0, status.st_mode & S_IFMT == S_IFSOCK else {
            fail("standard input is not a socket: kioskauth-fleet is started by kioskauthd, not by hand")
        }
        // No PR_SET_PDEATHSIG: it fires when the daemon's thread that started the helper ends,
        // and the daemon's pool threads come and go. The socket's end is what ends the helper:
        // the daemon holds the only other end, and the kernel closes it when the daemon dies.
        let finished = DispatchSemaphore(value: 0)
        Task.detached { [level] in
            do {
                try await FleetHelperServer.serve(descriptor: 0, logLevel: level)
            } catch {
                fail("cannot serve on standard input: \(error)")
            }
            finished.signal()
        }
        finished.wait()
        exit(0)
    }

    static func fail(_ message: String) -> Never {
        let line = "kioskauth-fleet: \(message)\n"
        _ = line.utf8CString.withUnsafeBufferPointer { write(2, $0.baseAddress, $0.count - 1) }
        exit(64)  // EX_USAGE
    }
}
