import Foundation
import KioskAuthProtocol
import Testing

/// The committed interface description, found beside the module's sources.
func interfaceFileText() throws -> String {
    let url = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent()  // KioskAuthProtocolTests
        .deletingLastPathComponent()  // Tests
        .deletingLastPathComponent()  // the package
        .appendingPathComponent("Sources/KioskAuthProtocol/io.kioskauth.varlink")
    return try String(contentsOf: url, encoding: .utf8)
}

/// A declaration or field in a varlink description that has no `#` comment line right above it.
struct UndocumentedItem: Equatable, CustomStringConvertible {
    var line: Int
    var text: String
    var description: String { "line \(line): \(text)" }
}

/// What the doc-comment check saw.
struct DocCommentReport {
    var methods = 0
    var types = 0
    var errors = 0
    var fields = 0
    var undocumented: [UndocumentedItem] = []
}

/// Checks that every `method`, `type` and `error`, and every field written on its own line, has a
/// `#` comment line directly above it; a `type` written on one line must be an enum (no fields).
func checkDocComments(_ text: String) -> DocCommentReport {
    var report = DocCommentReport()
    var depth = 0
    var previous = ""
    for (index, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
        let line = rawLine.trimmingCharacters(in: .whitespaces)
        defer { previous = line }
        if line.isEmpty || line.hasPrefix("#") { continue }
        let isDocumented = previous.hasPrefix("#")
        let item = UndocumentedItem(line: index + 1, text: line)
        if depth == 0 {
            let keyword = line.prefix { $0 != " " }
            switch keyword {
            case "method": report.methods += 1
            case "error": report.errors += 1
            case "type":
                report.types += 1
                if line.hasSuffix(")"), line.contains(":") { report.undocumented.append(item) }
            default: break
            }
            if ["method", "type", "error"].contains(keyword), !isDocumented { report.undocumented.append(item) }
        } else if line.first.map({ $0.isLetter || $0 == "_" }) == true, line.contains(":") {
            report.fields += 1
            if !isDocumented { report.undocumented.append(item) }
        }
        depth += line.filter { $0 == "(" }.count - line.filter { $0 == ")" }.count
    }
    return report
}

@Suite("The interface description")
struct InterfaceDescriptionTests {
    @Test func embeddedDescription_equalsTheCommittedVarlinkFile() throws {
        let file = try interfaceFileText()
        // The embedded text ends where the file's final newline begins.
        #expect(file.hasSuffix("\n"))
        #expect(KioskAuthInterface.description + "\n" == file)
    }

    @Test func description_declaresTheInterfaceByItsName() {
        let declaration = KioskAuthInterface.description.split(separator: "\n").first { $0.hasPrefix("interface ") }
        #expect(declaration == "interface \(KioskAuthInterface.name)")
    }

    @Test func everyMethodTypeFieldAndError_hasADocComment() throws {
        let report = checkDocComments(try interfaceFileText())
        #expect(report.undocumented == [], "undocumented: \(report.undocumented)")
        // The check really looked at something.
        #expect(report.methods >= 10)
        #expect(report.types >= 5)
        #expect(report.errors >= 10)
        #expect(report.fields >= 30)
    }

    @Test func docCommentCheck_flagsWhatIsMissing() {
        let text = """
            interface io.example

            # Documented.
            type Thing (
              # Documented field.
              a: int,
              b: string
            )
            type Inline (x: int)
            method Undocumented() -> ()

            # Documented.
            error Oops (reason: string)
            """
        let report = checkDocComments(text)
        #expect(report.undocumented.map(\.line) == [7, 9, 9, 10])
        #expect(report.fields == 2)
    }

    @Test func ownErrorNames_areQualifiedByTheInterface() {
        #expect(VarlinkErrorName.own("NoSuchPerson") == "io.kioskauth.NoSuchPerson")
        #expect(KioskAuthInterface.description.contains("error NoSuchPerson "))
    }
}
