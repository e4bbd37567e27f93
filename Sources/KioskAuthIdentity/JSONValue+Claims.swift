import FoundationEssentials
import KioskAuthProtocol

// Provider responses, token headers and claims, and key sets have open shapes: they are read as
// `JSONValue`s, parsed by the same strict parser as the socket's messages (valid UTF-8, no
// duplicate members, bounded nesting, nothing after the document).

extension JSONValue {
    /// Parses `data`, which must hold exactly one JSON object, strictly.
    static func parseObject(_ data: Data) -> [String: JSONValue]? {
        guard case .object(let object)? = try? JSONValue.parse(data) else { return nil }
        return object
    }

    var doubleValue: Double? {
        if case .number(let value) = self { return value }
        return nil
    }

    var boolValue: Bool? {
        if case .bool(let value) = self { return value }
        return nil
    }

    var objectValue: [String: JSONValue]? {
        if case .object(let value) = self { return value }
        return nil
    }

    /// A string, or the strings of an array of strings; `nil` for anything else.
    var stringList: [String]? {
        switch self {
        case .string(let value): return [value]
        case .array(let values):
            var result: [String] = []
            for value in values {
                guard let string = value.stringValue else { return nil }
                result.append(string)
            }
            return result
        default: return nil
        }
    }
}

extension Dictionary where Key == String, Value == JSONValue {
    /// Follows a dotted path such as `app_metadata.kioskauth_role`. A key that itself contains
    /// dots (some providers use URL-shaped claim names) is found first, before splitting.
    func value(atPath path: String) -> JSONValue? {
        if let direct = self[path] { return direct }
        var current: [String: JSONValue] = self
        let parts = path.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        for (index, part) in parts.enumerated() {
            guard let next = current[part] else { return nil }
            if index == parts.count - 1 { return next }
            guard let object = next.objectValue else { return nil }
            current = object
        }
        return nil
    }
}
