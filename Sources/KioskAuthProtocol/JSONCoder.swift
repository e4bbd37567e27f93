// `Codable` types to and from a `JSONValue` directly, without going through text (see
// JSONParser.swift).

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
