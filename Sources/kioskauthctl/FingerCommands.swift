import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

/// Streams a scanning call, showing progress on standard error; returns the final reply.
func scan<Input>(
    _ global: GlobalOptions, _ method: VarlinkMethod<Input, Message.ScanReply>, _ input: Input
) throws -> Message.ScanReply {
    let client = try global.connect()
    let parameters = try VarlinkCoding.encode(input)
    var final: Message.ScanReply?
    let interactive = isatty(STDERR_FILENO) != 0
    try client.callMore(method.qualifiedName, parameters: parameters) { reply in
        let decoded = try VarlinkCoding.decode(Message.ScanReply.self, from: reply)
        if global.json { printJSON(reply) }
        guard let progress = decoded.progress else {
            final = decoded
            return
        }
        guard !global.json else { return }
        var line: String
        if let stage = progress.stage, let stages = progress.stages, stages > 0, progress.state != "duplicate-check" {
            let width = 20
            let filled = min(width, stage * width / stages)
            line =
                "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
                + "] stage \(stage)/\(stages)"
            if let hint = progress.hint { line += ": \(hint)" }
        } else {
            line = progress.hint ?? progress.state
        }
        if interactive {
            writeStandardError("\r\u{1B}[K" + line)
        } else {
            writeStandardError(line + "\n")
        }
    }
    if interactive { writeStandardError("\n") }
    guard let final else { throw ValidationError("the daemon sent no result") }
    return final
}

let fingerNames = [
    "left-thumb", "left-index", "left-middle", "left-ring", "left-little",
    "right-thumb", "right-index", "right-middle", "right-ring", "right-little",
]

/// What to do about enrolled fingers the storage reader no longer holds.
func missingAdvice(name: String, _ missing: [String]) -> String {
    let finger = missing.count == 1 ? missing[0] : "FINGER"
    return "The reader lost \(missing.count == 1 ? "this print" : "these prints") (e.g. a virtual reader restarted): "
        + "kioskauthctl finger remove \(name) --finger \(finger), then enrol it again."
}

struct FingerCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "finger", abstract: "Enrol, list and remove fingers.",
        subcommands: [Enroll.self, List.self, Remove.self])

    struct Enroll: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Enrol a finger, with live progress.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String
        @Option(help: "Which finger: left-thumb ... right-little.", completion: .list(fingerNames))
        var finger = "right-index"
        @Option(help: "The reader to enrol on (an id from `kioskauthctl reader`); default the first.") var reader:
            String?

        func validate() throws {
            guard fingerNames.contains(finger) else {
                throw ValidationError("unknown finger '\(finger)': use \(fingerNames.joined(separator: ", "))")
            }
        }

        func run() throws {
            let reply = try scan(
                global, KioskAuthMethod.enrollFinger, Message.EnrollFinger(name: name, finger: finger, reader: reader))
            guard !global.json else { return }
            print("enrolled \(reply.finger ?? finger) for \(name)")
            if reply.duplicateChecked == false {
                print("note: duplicates were not checked (the reader cannot identify, or the check is off)")
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List a person's enrolled fingers.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let reply = try global.call(KioskAuthMethod.listFingers, Message.Name(name: name))
            guard !global.json else { return }
            let missing = reply.missingFromSensor ?? []
            for finger in reply.fingers {
                print(missing.contains(finger) ? "\(finger)\tmissing from the sensor" : finger)
            }
            if !missing.isEmpty { print(missingAdvice(name: name, missing)) }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove one finger, or all of a person's fingers (also from the sensor).")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String
        @Option(help: "The finger; all fingers when absent.", completion: .enrolledFingers) var finger: String?

        func validate() throws {
            if let finger, !fingerNames.contains(finger) { throw ValidationError("unknown finger '\(finger)'") }
        }

        func run() throws {
            let reply = try global.call(
                KioskAuthMethod.removeFinger, Message.RemoveFinger(name: name, finger: finger))
            if !global.json {
                print(reply.removed.isEmpty ? "nothing to remove" : "removed \(reply.removed.joined(separator: ", "))")
            }
        }
    }
}

struct VerifyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify", abstract: "Scan a finger and match one person; exits 0 only on a match.")
    @OptionGroup var global: GlobalOptions
    @Argument(help: "Login name.", completion: .people) var name: String

    func run() throws {
        let reply = try scan(global, KioskAuthMethod.verifyFinger, Message.VerifyFinger(name: name))
        if !global.json { print("matched \(reply.person?.displayName ?? name)") }
    }
}

struct IdentifyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "identify", abstract: "Scan a finger and say whose it is; exits 0 only when recognised.")
    @OptionGroup var global: GlobalOptions

    func run() throws {
        let reply = try scan(global, KioskAuthMethod.identify, Message.Identify())
        guard !global.json, let person = reply.person else { return }
        print("Welcome back, \(person.displayName) (\(person.name))")
    }
}

struct ReaderCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reader", abstract: "Show the fingerprint readers present.")
    @OptionGroup var global: GlobalOptions

    func run() throws {
        let reply = try global.call(KioskAuthMethod.getReaders, Message.Empty())
        guard !global.json else { return }
        if reply.readers.isEmpty { print("no fingerprint reader present (passcodes still work)") }
        for r in reply.readers {
            var features: [String] = [r.scanType]
            if r.canIdentify { features.append("identify") }
            if r.hasStorage { features.append("storage") }
            print(
                "\(r.id)\t\(r.name)\tdriver \(r.driver)\t\(r.enrollStages) enrol stages\t\(features.joined(separator: ", "))"
            )
        }
    }
}
