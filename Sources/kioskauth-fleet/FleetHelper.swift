import CKioskAuthSystem
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
        if arguments.first == "--sandbox-check" {
            sandboxCheck(Array(arguments.dropFirst()))
        }
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
        let notice = confine()
        let finished = DispatchSemaphore(value: 0)
        Task.detached { [level] in
            do {
                try await FleetHelperServer.serve(descriptor: 0, logLevel: level, notice: notice)
            } catch {
                fail("cannot serve on standard input: \(error)")
            }
            finished.signal()
        }
        finished.wait()
        // Nothing is left to flush (its log lines went over the socket, now closed): _exit, so no
        // exit-time destructor runs while the event-loop and pool threads still do.
        _exit(0)
    }

    /// What the helper may read once confined: the system's programs, libraries and
    /// configuration (the name service, DNS, CA roots under /etc/ssl and /usr/share, time
    /// zones; a directory CA file given with `sslrootcert=` must be under /etc or /usr), the CPU
    /// count, /proc. Not the store (/var/lib/kioskauth), not the credentials (/run/credentials),
    /// not another process's memory: nothing the daemon holds that the directory's client has no
    /// use for.
    static let readable = [
        "/usr", "/etc", "/lib", "/lib64", "/bin", "/sbin", "/sys/devices/system/cpu", "/dev/null", "/dev/urandom",
        // Often a link into /run (systemd-resolved, resolvconf): the rule lands on its target.
        "/etc/resolv.conf",
        // /proc: libdispatch's thread pool reads its workers' /proc/TID/stat under load, and
        // crashes if it cannot (it did, mid-call, on a loaded machine); no rule can name threads
        // started later. Another process's memory and descriptors stay closed (Landlock refuses
        // the ptrace access they need); its status, maps and environment do not.
        "/proc",
    ]

    /// Confines the process with Landlock (`kioskauth_landlock_confine`) before it reads a request.
    /// Returns a notice for the daemon's log when the kernel cannot confine it; any other failure
    /// stops the helper.
    static func confine() -> String? {
        var paths: [UnsafePointer<CChar>?] = readable.map { UnsafePointer(strdup($0)) }
        paths.append(nil)
        defer { for path in paths { free(UnsafeMutablePointer(mutating: path)) } }
        let result = kioskauth_landlock_confine(paths)
        // Landlock leaves what a process of the same user may do to another (signals, limits,
        // priorities) and the journal's native socket: the seccomp filter takes those.
        let filtered = kioskauth_seccomp_confine(getpid())
        guard filtered == 0 else {
            fail("cannot install its seccomp filter: \(String(cString: strerror(-filtered)))")
        }
        if result > 0 { return nil }
        if result == -ENOSYS || result == -EOPNOTSUPP {
            return
                "this kernel has no Landlock: the fleet helper is not confined, and can read what kioskauthd's user can"
        }
        fail("cannot confine itself with Landlock: \(String(cString: strerror(-result)))")
    }

    /// `--sandbox-check TARGET...`: confines itself as the helper does, then tries each target
    /// (a path to open for reading, `signal:PID`, `limit:PID` (read its open-files limit),
    /// `threads` (its threads' /proc stat files) or `datagram` (make a Unix datagram socket))
    /// and prints `TARGET<TAB>allowed` or
    /// `TARGET<TAB>denied (error)`. For tests and for admins checking a kernel.
    static func sandboxCheck(_ targets: [String]) -> Never {
        if let notice = confine() { fail(notice) }
        var report = ""
        for target in targets {
            let outcome: Int32
            if target.hasPrefix("signal:"), let pid = pid_t(target.dropFirst("signal:".count)) {
                outcome = kill(pid, 0) == 0 ? 0 : errno
            } else if target.hasPrefix("limit:"), let pid = pid_t(target.dropFirst("limit:".count)) {
                outcome = -kioskauth_read_file_limit(pid)
            } else if target == "threads" {
                // As libdispatch's pool monitor reads them: /proc/<pid>/task/<tid>/stat.
                outcome = threadStatsReadable() ? 0 : errno
            } else if target == "datagram" {
                outcome = closing(socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0))
            } else {
                outcome = closing(open(target, O_RDONLY | O_CLOEXEC))
            }
            report +=
                "\(target)\t" + (outcome == 0 ? "allowed" : "denied (\(String(cString: strerror(outcome))))") + "\n"
        }
        _ = report.utf8CString.withUnsafeBufferPointer { write(1, $0.baseAddress, $0.count - 1) }
        _exit(0)
    }

    /// 0 if `descriptor` was made (it is closed), else the errno of the attempt.
    static func closing(_ descriptor: Int32) -> Int32 {
        guard descriptor >= 0 else { return errno }
        close(descriptor)
        return 0
    }

    /// Whether every thread's /proc/<pid>/task/<tid>/stat opens.
    static func threadStatsReadable() -> Bool {
        let tasks = "/proc/\(getpid())/task"
        guard let directory = opendir(tasks) else { return false }
        defer { closedir(directory) }
        var opened = 0
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) {
                String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard name.first?.isNumber == true else { continue }
            let fd = open("\(tasks)/\(name)/stat", O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { return false }
            close(fd)
            opened += 1
        }
        return opened > 0
    }

    static func fail(_ message: String) -> Never {
        let line = "kioskauth-fleet: \(message)\n"
        _ = line.utf8CString.withUnsafeBufferPointer { write(2, $0.baseAddress, $0.count - 1) }
        _exit(64)  // EX_USAGE
    }
}
