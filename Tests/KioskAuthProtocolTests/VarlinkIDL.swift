import Foundation

/// A field of a varlink struct: its name and whether its type is optional (`?`).
struct IDLField: Equatable, CustomStringConvertible {
    var name: String
    var optional: Bool
    var description: String { optional ? "\(name)?" : name }
}

/// The methods and errors of a varlink interface description, parsed from its text.
struct IDLInterface {
    struct Method {
        var name: String
        var input: [IDLField]
        var output: [IDLField]
    }
    var methods: [String: Method] = [:]
    var errors: [String: [IDLField]] = [:]

    /// Parses `text`: comments are dropped, then each `method NAME (...) -> (...)` and
    /// `error NAME (...)` declaration is read with its fields.
    init(_ text: String) throws {
        let code = text.split(separator: "\n", omittingEmptySubsequences: false)
            .filter { !$0.trimmingCharacters(in: .whitespaces).hasPrefix("#") }
            .joined(separator: " ")
        var scanner = Substring(code)
        while let keyword = scanner.nextWord() {
            switch keyword {
            case "method":
                let name = try scanner.requireWord()
                let input = try scanner.parenthesised()
                try scanner.require("->")
                let output = try scanner.parenthesised()
                methods[name] = Method(name: name, input: try Self.fields(input), output: try Self.fields(output))
            case "error":
                let name = try scanner.requireWord()
                errors[name] = try Self.fields(try scanner.parenthesised())
            case "type":
                _ = try scanner.requireWord()
                _ = try scanner.parenthesised()
            default:
                break  // `interface NAME`
            }
        }
    }

    /// The fields of a struct body, `a: int, b: ?[]string`; an enum body has no `:` and no fields.
    static func fields(_ body: Substring) throws -> [IDLField] {
        var parts: [Substring] = []
        var depth = 0
        var start = body.startIndex
        for index in body.indices {
            switch body[index] {
            case "(": depth += 1
            case ")": depth -= 1
            case "," where depth == 0:
                parts.append(body[start..<index])
                start = body.index(after: index)
            default: break
            }
        }
        parts.append(body[start...])
        return try parts.map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }.compactMap { part in
            guard let colon = part.firstIndex(of: ":") else {
                if part.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) { return nil }  // enum value
                throw IDLError(message: "not a field: \(part)")
            }
            let type = part[part.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            return IDLField(name: part[..<colon].trimmingCharacters(in: .whitespaces), optional: type.hasPrefix("?"))
        }
    }
}

struct IDLError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}

extension Substring {
    fileprivate mutating func skipSpaces() { self = drop { $0 == " " || $0 == "\t" } }

    fileprivate mutating func nextWord() -> String? {
        skipSpaces()
        let word = prefix { $0.isLetter || $0.isNumber || $0 == "_" || $0 == "." }
        guard !word.isEmpty else {
            if isEmpty { return nil }
            self = dropFirst()  // punctuation outside a declaration
            return nextWord()
        }
        self = self[word.endIndex...]
        return String(word)
    }

    fileprivate mutating func requireWord() throws -> String {
        skipSpaces()
        let word = prefix { $0.isLetter || $0.isNumber || $0 == "_" }
        guard !word.isEmpty else { throw IDLError(message: "expected a name at: \(prefix(40))") }
        self = self[word.endIndex...]
        return String(word)
    }

    fileprivate mutating func require(_ token: String) throws {
        skipSpaces()
        guard hasPrefix(token) else { throw IDLError(message: "expected \(token) at: \(prefix(40))") }
        self = dropFirst(token.count)
    }

    /// The text between a `(` and its matching `)`.
    fileprivate mutating func parenthesised() throws -> Substring {
        try require("(")
        var depth = 1
        var index = startIndex
        while index < endIndex {
            if self[index] == "(" { depth += 1 }
            if self[index] == ")" {
                depth -= 1
                if depth == 0 {
                    let body = self[startIndex..<index]
                    self = self[self.index(after: index)...]
                    return body
                }
            }
            index = self.index(after: index)
        }
        throw IDLError(message: "unbalanced parentheses")
    }
}
