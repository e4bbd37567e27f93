// JSON for varlink messages without detours: bytes to `JSONValue` and back with a small strict
// parser and writer, and `JSONValue` to and from `Codable` types with a `Decoder`/`Encoder` that
// walk the value directly. The daemon used to go through text three times per message (parse to
// a value, print it, parse it again into the typed input; the same on the way out), which was a
// large part of a request's CPU time.

// MARK: Parsing

/// Why some bytes are not one acceptable JSON document.
public struct JSONSyntaxError: Error, CustomStringConvertible, Sendable, Equatable {
    /// What is wrong.
    public var reason: String
    /// Byte offset where it was noticed.
    public var offset: Int

    public var description: String { "\(reason) at byte \(offset)" }
}

extension JSONValue {
    /// Nesting deeper than this is refused (varlink messages here nest a few levels).
    public static let maximumNesting = 128

    /// Parses one JSON document (RFC 8259): valid UTF-8, no duplicate object keys, nesting at
    /// most `maximumNesting`, nothing but whitespace after it.
    public static func parse(_ bytes: some Sequence<UInt8>) throws(JSONSyntaxError) -> JSONValue {
        let array = Array(bytes)
        var parser = JSONParser(bytes: array)
        return try parser.document()
    }
}

private struct JSONParser {
    let bytes: [UInt8]
    var index = 0
    var depth = 0

    init(bytes: [UInt8]) { self.bytes = bytes }

    private func fail(_ reason: String) -> JSONSyntaxError { JSONSyntaxError(reason: reason, offset: index) }

    mutating func document() throws(JSONSyntaxError) -> JSONValue {
        let value = try parseValue()
        skipWhitespace()
        guard index == bytes.count else { throw fail("unexpected data after the JSON value") }
        return value
    }

    private mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    private mutating func parseValue() throws(JSONSyntaxError) -> JSONValue {
        skipWhitespace()
        guard index < bytes.count else { throw fail("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try literal("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try parseNumber())
        default: throw fail("unexpected character")
        }
    }

    private mutating func literal(_ word: StaticString) throws(JSONSyntaxError) {
        let count = word.utf8CodeUnitCount
        guard bytes.count - index >= count else { throw fail("unexpected end of input") }
        for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] {
            throw fail("invalid literal")
        }
        index += count
    }

    private mutating func enter() throws(JSONSyntaxError) {
        depth += 1
        guard depth <= JSONValue.maximumNesting else { throw fail("nested too deeply") }
    }

    private mutating func parseObject() throws(JSONSyntaxError) -> JSONValue {
        try enter()
        index += 1
        var members: [String: JSONValue] = [:]
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            depth -= 1
            return .object(members)
        }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a member name") }
            let key = try parseString()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            index += 1
            let value = try parseValue()
            guard members.updateValue(value, forKey: key) == nil else { throw fail("duplicate member \"\(key)\"") }
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "}") {
                index += 1
                depth -= 1
                return .object(members)
            } else {
                throw fail("expected ',' or '}'")
            }
        }
    }

    private mutating func parseArray() throws(JSONSyntaxError) -> JSONValue {
        try enter()
        index += 1
        var elements: [JSONValue] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            depth -= 1
            return .array(elements)
        }
        while true {
            elements.append(try parseValue())
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "]") {
                index += 1
                depth -= 1
                return .array(elements)
            } else {
                throw fail("expected ',' or ']'")
            }
        }
    }

    private mutating func parseNumber() throws(JSONSyntaxError) -> Double {
        let start = index
        func digits(_ parser: inout JSONParser) -> Int {
            let from = parser.index
            while parser.index < parser.bytes.count, (0x30...0x39).contains(parser.bytes[parser.index]) {
                parser.index += 1
            }
            return parser.index - from
        }
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count else { throw fail("invalid number") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else if digits(&self) == 0 {
            throw fail("invalid number")
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digits(&self) > 0 else { throw fail("invalid number") }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            guard digits(&self) > 0 else { throw fail("invalid number") }
        }
        let text = String(decoding: bytes[start..<index], as: UTF8.self)
        guard let value = Double(text), value.isFinite else { throw fail("number out of range") }
        return value
    }

    private mutating func hexQuad() throws(JSONSyntaxError) -> UInt16 {
        guard bytes.count - index >= 4 else { throw fail("unexpected end of input") }
        var value: UInt16 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt8
            switch byte {
            case 0x30...0x39: digit = byte - 0x30
            case 0x41...0x46: digit = byte - 0x41 + 10
            case 0x61...0x66: digit = byte - 0x61 + 10
            default: throw fail("invalid \\u escape")
            }
            value = value << 4 | UInt16(digit)
            index += 1
        }
        return value
    }

    private mutating func parseString() throws(JSONSyntaxError) -> String {
        index += 1
        let start = index
        // Fast path: no escapes.
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let slice = bytes[start..<index]
                index += 1
                guard let text = String(validating: slice, as: UTF8.self) else { throw fail("invalid UTF-8") }
                return text
            }
            if byte == UInt8(ascii: "\\") { break }
            guard byte >= 0x20 else { throw fail("control character in a string") }
            index += 1
        }
        var buffer = Array(bytes[start..<index])
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                guard let text = String(validating: buffer, as: UTF8.self) else { throw fail("invalid UTF-8") }
                return text
            case UInt8(ascii: "\\"):
                index += 1
                guard index < bytes.count else { throw fail("unexpected end of input") }
                let escape = bytes[index]
                index += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): buffer.append(escape)
                case UInt8(ascii: "b"): buffer.append(0x08)
                case UInt8(ascii: "f"): buffer.append(0x0C)
                case UInt8(ascii: "n"): buffer.append(0x0A)
                case UInt8(ascii: "r"): buffer.append(0x0D)
                case UInt8(ascii: "t"): buffer.append(0x09)
                case UInt8(ascii: "u"):
                    let unit = try hexQuad()
                    var scalarValue = UInt32(unit)
                    if (0xD800...0xDBFF).contains(unit) {
                        guard bytes.count - index >= 6, bytes[index] == UInt8(ascii: "\\"),
                            bytes[index + 1] == UInt8(ascii: "u")
                        else { throw fail("unpaired surrogate") }
                        index += 2
                        let low = try hexQuad()
                        guard (0xDC00...0xDFFF).contains(low) else { throw fail("unpaired surrogate") }
                        scalarValue = 0x10000 + ((UInt32(unit) - 0xD800) << 10) + (UInt32(low) - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(unit) {
                        throw fail("unpaired surrogate")
                    }
                    guard let scalar = Unicode.Scalar(scalarValue) else { throw fail("invalid \\u escape") }
                    buffer.append(contentsOf: String(Character(scalar)).utf8)
                default: throw fail("invalid escape")
                }
            default:
                guard byte >= 0x20 else { throw fail("control character in a string") }
                buffer.append(byte)
                index += 1
            }
        }
        throw fail("unterminated string")
    }
}

// MARK: Writing

/// A value that JSON cannot carry (a non-finite number).
public struct JSONWriteError: Error, Sendable {
    public var reason: String
}

extension JSONValue {
    /// The value as compact JSON text: object members sorted by name, `/` not escaped, integral
    /// numbers below 10^15 without a fraction.
    public func serialized() throws(JSONWriteError) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        try write(into: &out)
        return out
    }

    private func write(into out: inout [UInt8]) throws(JSONWriteError) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let value): out.append(contentsOf: (value ? "true" : "false").utf8)
        case .number(let value):
            guard value.isFinite else { throw JSONWriteError(reason: "a number is not finite") }
            if value.rounded() == value, abs(value) < 1e15 {
                out.append(contentsOf: String(Int64(value)).utf8)
            } else {
                out.append(contentsOf: "\(value)".utf8)
            }
        case .string(let value): Self.writeString(value, into: &out)
        case .array(let elements):
            out.append(UInt8(ascii: "["))
            for (position, element) in elements.enumerated() {
                if position > 0 { out.append(UInt8(ascii: ",")) }
                try element.write(into: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            for (position, key) in members.keys.sorted().enumerated() {
                if position > 0 { out.append(UInt8(ascii: ",")) }
                Self.writeString(key, into: &out)
                out.append(UInt8(ascii: ":"))
                try members[key]!.write(into: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)

    private static func writeString(_ text: String, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
            case UInt8(ascii: "\\"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
            case 0x0A: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
            case 0x0D: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
            case 0x09: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
            case 0x00..<0x20:
                out.append(contentsOf: "\\u00".utf8)
                out.append(hexDigits[Int(byte >> 4)])
                out.append(hexDigits[Int(byte & 0x0F)])
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

// MARK: Decoding Codable types from a value

/// Decodes `Decodable` types straight from a `JSONValue`, with the same rules as Foundation's
/// `JSONDecoder` for the types the protocol uses: numbers must fit the integer type exactly,
/// a missing key and `null` are both absent for optionals.
public struct JSONValueDecoder {
    public init() {}

    public func decode<T: Decodable>(_ type: T.Type, from value: JSONValue) throws -> T {
        if let value = value as? T { return value }
        return try T(from: ValueDecoder(value: value, codingPath: []))
    }
}

private struct ValueKey: CodingKey {
    var stringValue: String
    var intValue: Int?
    init(stringValue: String) { self.stringValue = stringValue }
    init(intValue: Int) {
        self.stringValue = "Index \(intValue)"
        self.intValue = intValue
    }
}

private func kindName(_ value: JSONValue) -> String {
    switch value {
    case .null: return "null"
    case .bool: return "a boolean"
    case .number: return "a number"
    case .string: return "a string"
    case .array: return "an array"
    case .object: return "an object"
    }
}

private func mismatch(_ type: Any.Type, _ value: JSONValue, _ path: [any CodingKey]) -> DecodingError {
    .typeMismatch(
        type, .init(codingPath: path, debugDescription: "Expected \(type) but found \(kindName(value)) instead."))
}

private func unbox<T>(_ value: JSONValue, as type: T.Type, path: [any CodingKey]) throws -> T {
    switch (value, type) {
    case (.bool(let bool), is Bool.Type): return bool as! T
    case (.string(let string), is String.Type): return string as! T
    case (.number(let number), is Double.Type): return number as! T
    case (.number(let number), is Float.Type):
        return Float(number) as! T
    default: break
    }
    throw mismatch(type, value, path)
}

private func unboxInteger<T: FixedWidthInteger>(_ value: JSONValue, as type: T.Type, path: [any CodingKey]) throws -> T
{
    guard case .number(let number) = value else { throw mismatch(type, value, path) }
    guard number.rounded() == number, let integer = T(exactly: number) else {
        throw DecodingError.dataCorrupted(
            .init(codingPath: path, debugDescription: "Number \(number) does not fit in \(T.self)."))
    }
    return integer
}

private struct ValueDecoder: Decoder {
    let value: JSONValue
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .object(let members) = value else { throw mismatch([String: Any].self, value, codingPath) }
        return KeyedDecodingContainer(KeyedValueContainer<Key>(members: members, codingPath: codingPath))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let elements) = value else { throw mismatch([Any].self, value, codingPath) }
        return UnkeyedValueContainer(elements: elements, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        SingleValueContainer(value: value, codingPath: codingPath)
    }
}

/// Optionals and `JSONValue` itself take `null`; anything else found null is missing.
private protocol OptionalMarker {}
extension Optional: OptionalMarker {}

private func acceptsNull(_ type: Any.Type) -> Bool { type == JSONValue.self || type is any OptionalMarker.Type }

private func decodeValue<T: Decodable>(_ type: T.Type, from value: JSONValue, path: [any CodingKey]) throws -> T {
    if T.self == JSONValue.self { return value as! T }
    switch type {
    case is String.Type, is Bool.Type, is Double.Type, is Float.Type: return try unbox(value, as: type, path: path)
    case is Int.Type: return try unboxInteger(value, as: Int.self, path: path) as! T
    case is Int64.Type: return try unboxInteger(value, as: Int64.self, path: path) as! T
    case is Int32.Type: return try unboxInteger(value, as: Int32.self, path: path) as! T
    case is UInt32.Type: return try unboxInteger(value, as: UInt32.self, path: path) as! T
    case is UInt64.Type: return try unboxInteger(value, as: UInt64.self, path: path) as! T
    default: return try T(from: ValueDecoder(value: value, codingPath: path))
    }
}

private struct KeyedValueContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let members: [String: JSONValue]
    let codingPath: [any CodingKey]

    var allKeys: [Key] { members.keys.compactMap { Key(stringValue: $0) } }
    func contains(_ key: Key) -> Bool { members[key.stringValue] != nil }

    private func member(_ key: Key) throws -> JSONValue {
        guard let value = members[key.stringValue] else {
            throw DecodingError.keyNotFound(
                key, .init(codingPath: codingPath, debugDescription: "No value for key \"\(key.stringValue)\"."))
        }
        return value
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        guard let value = members[key.stringValue] else { return true }
        return value == .null
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        let value = try member(key)
        if value == .null, !acceptsNull(T.self) {
            throw DecodingError.valueNotFound(
                type, .init(codingPath: codingPath + [key], debugDescription: "Found null for a required value."))
        }
        return try decodeValue(type, from: value, path: codingPath + [key])
    }

    func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
        guard let value = members[key.stringValue], value != .null else { return nil }
        return try decodeValue(type, from: value, path: codingPath + [key])
    }

    func nestedContainer<NestedKey: CodingKey>(
        keyedBy type: NestedKey.Type, forKey key: Key
    ) throws -> KeyedDecodingContainer<NestedKey> {
        try ValueDecoder(value: try member(key), codingPath: codingPath + [key]).container(keyedBy: type)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try ValueDecoder(value: try member(key), codingPath: codingPath + [key]).unkeyedContainer()
    }

    func superDecoder() throws -> any Decoder {
        ValueDecoder(value: members["super"] ?? .null, codingPath: codingPath + [ValueKey(stringValue: "super")])
    }

    func superDecoder(forKey key: Key) throws -> any Decoder {
        ValueDecoder(value: members[key.stringValue] ?? .null, codingPath: codingPath + [key])
    }
}

private struct UnkeyedValueContainer: UnkeyedDecodingContainer {
    let elements: [JSONValue]
    let codingPath: [any CodingKey]
    var currentIndex = 0

    init(elements: [JSONValue], codingPath: [any CodingKey]) {
        self.elements = elements
        self.codingPath = codingPath
    }

    var count: Int? { elements.count }
    var isAtEnd: Bool { currentIndex >= elements.count }

    private var currentPath: [any CodingKey] { codingPath + [ValueKey(intValue: currentIndex)] }

    private mutating func next(_ type: Any.Type) throws -> JSONValue {
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(
                type, .init(codingPath: currentPath, debugDescription: "Unkeyed container is at end."))
        }
        defer { currentIndex += 1 }
        return elements[currentIndex]
    }

    mutating func decodeNil() throws -> Bool {
        guard !isAtEnd, elements[currentIndex] == .null else { return false }
        currentIndex += 1
        return true
    }

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
        let path = currentPath
        let value = try next(type)
        if value == .null, !acceptsNull(T.self) {
            throw DecodingError.valueNotFound(
                type, .init(codingPath: path, debugDescription: "Found null for a required value."))
        }
        return try decodeValue(type, from: value, path: path)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy type: NestedKey.Type
    ) throws -> KeyedDecodingContainer<NestedKey> {
        let path = currentPath
        return try ValueDecoder(value: try next([String: Any].self), codingPath: path).container(keyedBy: type)
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        let path = currentPath
        return try ValueDecoder(value: try next([Any].self), codingPath: path).unkeyedContainer()
    }

    mutating func superDecoder() throws -> any Decoder {
        let path = currentPath
        return ValueDecoder(value: try next(Any.self), codingPath: path)
    }
}

private struct SingleValueContainer: SingleValueDecodingContainer {
    let value: JSONValue
    let codingPath: [any CodingKey]

    func decodeNil() -> Bool { value == .null }

    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        if value == .null, !acceptsNull(T.self) {
            throw DecodingError.valueNotFound(
                type, .init(codingPath: codingPath, debugDescription: "Found null for a required value."))
        }
        return try decodeValue(type, from: value, path: codingPath)
    }
}

// MARK: Encoding Codable types to a value

/// Encodes `Encodable` types straight to a `JSONValue`; nil optionals are left out, as
/// `JSONEncoder` does.
public struct JSONValueEncoder {
    public init() {}

    public func encode(_ value: some Encodable) throws -> JSONValue {
        if let value = value as? JSONValue { return value }
        let root = EncodingNode()
        try value.encode(to: ValueEncoder(node: root, codingPath: []))
        return root.value ?? .object([:])
    }
}

/// A value under construction: a leaf, or an object or array whose members are nodes.
private final class EncodingNode {
    enum Storage {
        case empty
        case leaf(JSONValue)
        case object([String: EncodingNode])
        case array([EncodingNode])
    }
    var storage: Storage = .empty

    var value: JSONValue? {
        switch storage {
        case .empty: return nil
        case .leaf(let value): return value
        case .object(let members): return .object(members.compactMapValues { $0.value })
        case .array(let elements): return .array(elements.map { $0.value ?? .object([:]) })
        }
    }

    func objectMembers() -> [String: EncodingNode] {
        if case .object(let members) = storage { return members }
        storage = .object([:])
        return [:]
    }

    func child(forKey key: String) -> EncodingNode {
        var members = objectMembers()
        if let existing = members[key] { return existing }
        let node = EncodingNode()
        members[key] = node
        storage = .object(members)
        return node
    }

    func set(_ value: JSONValue, forKey key: String) {
        var members = objectMembers()
        let node = EncodingNode()
        node.storage = .leaf(value)
        members[key] = node
        storage = .object(members)
    }

    func appendChild() -> EncodingNode {
        var elements: [EncodingNode] = []
        if case .array(let existing) = storage { elements = existing }
        let node = EncodingNode()
        elements.append(node)
        storage = .array(elements)
        return node
    }

    var arrayCount: Int {
        if case .array(let elements) = storage { return elements.count }
        return 0
    }

    func makeArray() {
        if case .array = storage { return }
        storage = .array([])
    }
}

private func box<T: Encodable>(_ value: T, path: [any CodingKey]) throws -> JSONValue {
    switch value {
    case let value as JSONValue: return value
    case let value as String: return .string(value)
    case let value as Bool: return .bool(value)
    case let value as Double:
        guard value.isFinite else {
            throw EncodingError.invalidValue(value, .init(codingPath: path, debugDescription: "Not a finite number."))
        }
        return .number(value)
    case let value as Int: return .number(Double(value))
    case let value as Int64: return .number(Double(value))
    case let value as Int32: return .number(Double(value))
    case let value as UInt32: return .number(Double(value))
    case let value as UInt64: return .number(Double(value))
    default:
        let node = EncodingNode()
        try value.encode(to: ValueEncoder(node: node, codingPath: path))
        return node.value ?? .object([:])
    }
}

private struct ValueEncoder: Encoder {
    let node: EncodingNode
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        _ = node.objectMembers()
        return KeyedEncodingContainer(KeyedValueEncodingContainer<Key>(node: node, codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        node.makeArray()
        return UnkeyedValueEncodingContainer(node: node, codingPath: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        SingleValueEncoderContainer(node: node, codingPath: codingPath)
    }
}

private struct KeyedValueEncodingContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let node: EncodingNode
    let codingPath: [any CodingKey]

    mutating func encodeNil(forKey key: Key) throws { node.set(.null, forKey: key.stringValue) }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        node.set(try box(value, path: codingPath + [key]), forKey: key.stringValue)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy keyType: NestedKey.Type, forKey key: Key
    ) -> KeyedEncodingContainer<NestedKey> {
        let child = node.child(forKey: key.stringValue)
        _ = child.objectMembers()
        return KeyedEncodingContainer(
            KeyedValueEncodingContainer<NestedKey>(node: child, codingPath: codingPath + [key]))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        let child = node.child(forKey: key.stringValue)
        child.makeArray()
        return UnkeyedValueEncodingContainer(node: child, codingPath: codingPath + [key])
    }

    mutating func superEncoder() -> any Encoder {
        ValueEncoder(node: node.child(forKey: "super"), codingPath: codingPath + [ValueKey(stringValue: "super")])
    }

    mutating func superEncoder(forKey key: Key) -> any Encoder {
        ValueEncoder(node: node.child(forKey: key.stringValue), codingPath: codingPath + [key])
    }
}

private struct UnkeyedValueEncodingContainer: UnkeyedEncodingContainer {
    let node: EncodingNode
    let codingPath: [any CodingKey]
    var count: Int { node.arrayCount }

    private var nextPath: [any CodingKey] { codingPath + [ValueKey(intValue: count)] }

    mutating func encodeNil() throws { node.appendChild().storage = .leaf(.null) }

    mutating func encode<T: Encodable>(_ value: T) throws {
        let path = nextPath
        let boxed = try box(value, path: path)
        node.appendChild().storage = .leaf(boxed)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy keyType: NestedKey.Type
    ) -> KeyedEncodingContainer<NestedKey> {
        let path = nextPath
        let child = node.appendChild()
        _ = child.objectMembers()
        return KeyedEncodingContainer(KeyedValueEncodingContainer<NestedKey>(node: child, codingPath: path))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let path = nextPath
        let child = node.appendChild()
        child.makeArray()
        return UnkeyedValueEncodingContainer(node: child, codingPath: path)
    }

    mutating func superEncoder() -> any Encoder {
        let path = nextPath
        return ValueEncoder(node: node.appendChild(), codingPath: path)
    }
}

private struct SingleValueEncoderContainer: SingleValueEncodingContainer {
    let node: EncodingNode
    let codingPath: [any CodingKey]

    mutating func encodeNil() throws { node.storage = .leaf(.null) }

    mutating func encode<T: Encodable>(_ value: T) throws {
        node.storage = .leaf(try box(value, path: codingPath))
    }
}
