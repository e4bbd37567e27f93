import Foundation

/// A decoded JSON document: token claims, provider responses and error bodies have open shapes.
enum JSONValue: Sendable, Equatable, Decodable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    /// Parses `data`, which must hold a JSON object.
    static func parseObject(_ data: Data) -> [String: JSONValue]? {
        guard case .object(let object)? = try? JSONDecoder().decode(JSONValue.self, from: data) else {
            return nil
        }
        return object
    }

    var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
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
