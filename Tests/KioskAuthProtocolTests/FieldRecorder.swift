/// The fields a `Decodable` type reads, found by decoding it from nothing: each key its
/// `init(from:)` asks for at the top level, and whether it asks for it optionally
/// (`decodeIfPresent`, which the synthesised conformance uses for optional properties).
struct DecodedField: Equatable, CustomStringConvertible {
    var name: String
    var optional: Bool
    var description: String { optional ? "\(name)?" : name }
}

func decodedFields(of type: any Decodable.Type) throws -> [DecodedField] {
    let log = FieldLog()
    _ = try type.init(from: RecordingDecoder(log: log))
    return log.fields
}

private final class FieldLog {
    var fields: [DecodedField] = []

    func record(_ name: String, optional: Bool) {
        if let index = fields.firstIndex(where: { $0.name == name }) {
            fields[index].optional = fields[index].optional && optional
        } else {
            fields.append(DecodedField(name: name, optional: optional))
        }
    }
}

/// Hands out empty values; records top-level keys in `log` (nested values have none).
private struct RecordingDecoder: Decoder {
    let log: FieldLog?
    var codingPath: [any CodingKey] = []
    var userInfo: [CodingUserInfoKey: Any] = [:]

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        KeyedDecodingContainer(RecordingKeyedContainer<Key>(log: log))
    }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer { EmptyUnkeyedContainer() }
    func singleValueContainer() throws -> any SingleValueDecodingContainer { EmptyValueContainer() }
}

private struct RecordingKeyedContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let log: FieldLog?
    var codingPath: [any CodingKey] = []
    var allKeys: [Key] { [] }

    /// `decodeIfPresent` asks this first; saying no ends the optional read there.
    func contains(_ key: Key) -> Bool {
        log?.record(key.stringValue, optional: true)
        return false
    }
    func decodeNil(forKey key: Key) throws -> Bool { true }
    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { required(key, false) }
    func decode(_ type: String.Type, forKey key: Key) throws -> String { required(key, "") }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double { required(key, 0) }
    func decode(_ type: Float.Type, forKey key: Key) throws -> Float { required(key, 0) }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { required(key, 0) }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { required(key, 0) }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { required(key, 0) }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { required(key, 0) }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { required(key, 0) }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { required(key, 0) }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { required(key, 0) }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { required(key, 0) }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { required(key, 0) }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { required(key, 0) }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        log?.record(key.stringValue, optional: false)
        return try T(from: RecordingDecoder(log: nil))
    }
    func nestedContainer<NestedKey: CodingKey>(
        keyedBy type: NestedKey.Type, forKey key: Key
    ) throws -> KeyedDecodingContainer<NestedKey> {
        log?.record(key.stringValue, optional: false)
        return KeyedDecodingContainer(RecordingKeyedContainer<NestedKey>(log: nil))
    }
    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        log?.record(key.stringValue, optional: false)
        return EmptyUnkeyedContainer()
    }
    func superDecoder() throws -> any Decoder { RecordingDecoder(log: nil) }
    func superDecoder(forKey key: Key) throws -> any Decoder { RecordingDecoder(log: nil) }

    private func required<T>(_ key: Key, _ value: T) -> T {
        log?.record(key.stringValue, optional: false)
        return value
    }
}

private struct EmptyUnkeyedContainer: UnkeyedDecodingContainer {
    var codingPath: [any CodingKey] = []
    var count: Int? { 0 }
    var isAtEnd: Bool { true }
    var currentIndex: Int { 0 }
    struct Exhausted: Error {}
    mutating func decodeNil() throws -> Bool { throw Exhausted() }
    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { throw Exhausted() }
    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy type: NestedKey.Type
    ) throws -> KeyedDecodingContainer<NestedKey> { throw Exhausted() }
    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer { throw Exhausted() }
    mutating func superDecoder() throws -> any Decoder { throw Exhausted() }
}

private struct EmptyValueContainer: SingleValueDecodingContainer {
    var codingPath: [any CodingKey] = []
    func decodeNil() -> Bool { true }
    func decode(_ type: Bool.Type) throws -> Bool { false }
    func decode(_ type: String.Type) throws -> String { "" }
    func decode(_ type: Double.Type) throws -> Double { 0 }
    func decode(_ type: Float.Type) throws -> Float { 0 }
    func decode(_ type: Int.Type) throws -> Int { 0 }
    func decode(_ type: Int8.Type) throws -> Int8 { 0 }
    func decode(_ type: Int16.Type) throws -> Int16 { 0 }
    func decode(_ type: Int32.Type) throws -> Int32 { 0 }
    func decode(_ type: Int64.Type) throws -> Int64 { 0 }
    func decode(_ type: UInt.Type) throws -> UInt { 0 }
    func decode(_ type: UInt8.Type) throws -> UInt8 { 0 }
    func decode(_ type: UInt16.Type) throws -> UInt16 { 0 }
    func decode(_ type: UInt32.Type) throws -> UInt32 { 0 }
    func decode(_ type: UInt64.Type) throws -> UInt64 { 0 }
    func decode<T: Decodable>(_ type: T.Type) throws -> T { try T(from: RecordingDecoder(log: nil)) }
}
