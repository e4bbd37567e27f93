import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

/// Where a method's replies go. A `more` call may send several, each but the last with
/// `continues: true`; other calls send exactly one.
public struct ReplySink: Sendable {
    let send: @Sendable (VarlinkReply) async throws -> Void
    /// Whether the client asked for several replies.
    public let wantsMore: Bool

    /// Sends an intermediate reply of a `more` call.
    func progress(_ value: some Encodable & Sendable) async throws {
        try await send(VarlinkReply(parameters: try VarlinkCoding.encode(value), continues: true))
    }
}

/// A method's implementation: decode input, call the authority, encode the output.
typealias MethodHandler = @Sendable (Caller, JSONValue?, ReplySink) async throws -> JSONValue

/// A method that does no I/O and needs no actor, answered where the call is read: the reply's
/// frame (NUL included), or nil when it cannot answer this call (then it takes the ordinary
/// path, which reports why).
typealias ImmediateHandler = @Sendable (Caller, JSONValue?) -> [UInt8]?

/// Routes calls to methods: `org.varlink.service` for introspection, `io.kioskauth` for the rest.
public struct Dispatcher: Sendable {
    private var methods: [String: MethodHandler] = [:]
    private var immediateMethods: [String: ImmediateHandler] = [:]

    static let serviceInterfaceDescription = """
        # The Varlink Service Interface is provided by every varlink service. It
        # describes the service and the interfaces it implements.
        interface org.varlink.service

        # Get a list of all the interfaces a service provides and information
        # about the implementation.
        method GetInfo() -> (
          vendor: string,
          product: string,
          version: string,
          url: string,
          interfaces: []string
        )

        # Get the description of an interface that is implemented by this service.
        method GetInterfaceDescription(interface: string) -> (description: string)

        # The requested interface was not found.
        error InterfaceNotFound (interface: string)

        # The requested method was not found
        error MethodNotFound (method: string)

        # The interface defines the requested method, but the service does not
        # implement it.
        error MethodNotImplemented (method: string)

        # One of the passed parameters is invalid.
        error InvalidParameter (parameter: string)

        # Client is denied access
        error PermissionDenied ()

        # Method is expected to be called with 'more' set to true, but wasn't
        error ExpectedMore ()
        """

    /// Routes every method of the interface to `authority`.
    public init(authority: Authority) {
        register("org.varlink.service.GetInfo") { (_: Message.Empty, _, _) in
            ServiceInfo(
                vendor: "kioskauth", product: "kioskauthd", version: KioskAuthVersion.string,
                url: "https://github.com/kioskauth/kioskauth",
                interfaces: ["org.varlink.service", KioskAuthInterface.name])
        }
        register("org.varlink.service.GetInterfaceDescription") { (input: InterfaceRequest, _, _) in
            switch input.interface {
            case "org.varlink.service": return InterfaceDescriptionReply(description: Self.serviceInterfaceDescription)
            case KioskAuthInterface.name: return InterfaceDescriptionReply(description: KioskAuthInterface.description)
            default: throw APIError.interfaceNotFound(input.interface)
            }
        }
        register(KioskAuthMethod.getStatus) { (input, caller, _) in
            try await authority.terminal.status(caller, summary: input.summary ?? false)
        }
        register(KioskAuthMethod.addPerson) { (input, caller, _) in
            try await authority.credentials.addPerson(caller, input)
        }
        register(KioskAuthMethod.issueActivationCode) { (input, caller, _) in
            try await authority.credentials.issueActivationCode(caller, input.name)
        }
        register(KioskAuthMethod.revokeActivationCode) { (input, caller, _) in
            Message.Revoked(revoked: try await authority.credentials.revokeActivationCode(caller, input.name))
        }
        register(KioskAuthMethod.checkActivationCode) { (input, caller, _) in
            try await authority.credentials.checkActivationCode(caller, input)
        }
        register(KioskAuthMethod.completeActivation) { (input, caller, _) in
            try await authority.credentials.completeActivation(caller, input)
        }
        register(KioskAuthMethod.checkAccount) { (input, caller, _) in
            try await authority.credentials.checkAccount(caller, input)
        }
        register(KioskAuthMethod.exportPerson) { (input, caller, _) in
            try await authority.credentials.exportPerson(caller, input.name)
        }
        register(KioskAuthMethod.listPeople) { (_, caller, _) in
            Message.People(people: try await authority.credentials.listPeople(caller))
        }
        register(KioskAuthMethod.getPerson) { (input, caller, _) in
            Message.PersonReply(person: try await authority.credentials.getPerson(caller, input.name))
        }
        register(KioskAuthMethod.removePerson) { (input, caller, _) in
            try await authority.credentials.removePerson(caller, input.name)
            return Message.Empty()
        }
        register(KioskAuthMethod.setPasscode) { (input, caller, _) in
            Message.PersonReply(person: try await authority.credentials.setPasscode(caller, input))
        }
        register(KioskAuthMethod.verifyPasscode) { (input, caller, _) in
            try await authority.credentials.verifyPasscode(caller, input)
        }
        register(KioskAuthMethod.suspendPerson) { (input, caller, _) in
            Message.PersonReply(person: try await authority.credentials.suspendPerson(caller, input))
        }
        register(KioskAuthMethod.resumePerson) { (input, caller, _) in
            Message.PersonReply(person: try await authority.credentials.resumePerson(caller, input.name))
        }
        register(KioskAuthMethod.bindAccount) { (input, caller, _) in
            Message.PersonReply(person: try await authority.credentials.bindAccount(caller, input))
        }
        register(KioskAuthMethod.resetLockout) { (input, caller, _) in
            Message.PersonReply(person: try await authority.credentials.resetLockout(caller, input.name))
        }
        register(KioskAuthMethod.getReaders) { (_, caller, _) in
            Message.Readers(readers: await authority.credentials.readers(caller))
        }
        register(KioskAuthMethod.enrollFinger) { (input, caller, sink) in
            try await authority.credentials.enrollFinger(caller, input, sink: sink)
        }
        register(KioskAuthMethod.listFingers) { (input, caller, _) in
            try await authority.credentials.listFingers(caller, input.name)
        }
        register(KioskAuthMethod.removeFinger) { (input, caller, _) in
            Message.Removed(removed: try await authority.credentials.removeFinger(caller, input))
        }
        register(KioskAuthMethod.verifyFinger) { (input, caller, sink) in
            try await authority.credentials.verifyFinger(caller, input, sink: sink)
        }
        register(KioskAuthMethod.identify) { (input, caller, sink) in
            try await authority.credentials.identify(caller, input, sink: sink)
        }
        register(KioskAuthMethod.getAudit) { (input, caller, _) in
            Message.AuditEvents(events: try await authority.terminal.auditEvents(caller, input))
        }
        register(KioskAuthMethod.verifyAudit) { (input, caller, _) in
            try await authority.terminal.verifyAudit(caller, input)
        }
        registerOnlineMethods(authority: authority)
        // The same methods, answered without a hop to the actor when nothing can fail.
        registerImmediate("org.varlink.service.GetInfo") { (_: Message.Empty, _) in
            ServiceInfo(
                vendor: "kioskauth", product: "kioskauthd", version: KioskAuthVersion.string,
                url: "https://github.com/kioskauth/kioskauth",
                interfaces: ["org.varlink.service", KioskAuthInterface.name])
        }
        registerImmediate("org.varlink.service.GetInterfaceDescription") { (input: InterfaceRequest, _) in
            switch input.interface {
            case "org.varlink.service": InterfaceDescriptionReply(description: Self.serviceInterfaceDescription)
            case KioskAuthInterface.name: InterfaceDescriptionReply(description: KioskAuthInterface.description)
            default: nil
            }
        }
        // The summary reads every person on the actor: only the plain status is immediate.
        registerImmediate(KioskAuthMethod.getStatus.qualifiedName) { (input: Message.GetStatus, caller) in
            input.summary == true ? nil : authority.immediateStatus(caller)
        }
        registerMetricsMethods(authority: authority)
        registerFleetMethods(authority: authority)
        assert(
            KioskAuthMethod.all.allSatisfy { methods[KioskAuthInterface.name + "." + $0.name] != nil },
            "a method of the interface has no handler")
    }

    /// Registers the handler of one of the interface's methods; its input and output are the
    /// method's declared types.
    mutating func register<Input, Output>(
        _ method: VarlinkMethod<Input, Output>,
        _ body: @escaping @Sendable (Input, Caller, ReplySink) async throws -> Output
    ) {
        register(method.qualifiedName, body)
    }

    /// Registers a method that may be answered immediately. Anything unusual about the call
    /// (parameters that are not an object, forbidden text, input that does not decode, an answer
    /// that does not encode) leaves it to the ordinary path, which says what is wrong. Answers
    /// repeat (the same status until something changes), so the frames of the last few distinct
    /// ones are kept (`ReplyFrameCache`) and a call whose answer equals one costs no encoding.
    mutating func registerImmediate<
        Input: Decodable & SendableMetatype, Output: Encodable & Equatable & Sendable & SendableMetatype
    >(
        _ method: String, _ body: @escaping @Sendable (Input, Caller) -> Output?
    ) {
        let frames = ReplyFrameCache<Output>()
        immediateMethods[method] = { (caller: Caller, parameters: JSONValue?) -> [UInt8]? in
            switch parameters {
            case nil, .null?: break
            case .object(let members)?:
                guard (try? Self.checkText(.object(members), path: "")) != nil else { return nil }
            default: return nil
            }
            guard let input = try? VarlinkCoding.decode(Input.self, from: parameters == .null ? nil : parameters),
                let output = body(input, caller)
            else { return nil }
            return frames.frame(for: output)
        }
    }

    /// The immediate form of `method`, if it has one.
    func immediate(_ method: String) -> ImmediateHandler? { immediateMethods[method] }

    /// Registers a typed handler; input that does not decode is `InvalidParameter` naming the
    /// first offending field.
    mutating func register<Input: Decodable & SendableMetatype, Output: Encodable & SendableMetatype>(
        _ method: String, _ body: @escaping @Sendable (Input, Caller, ReplySink) async throws -> Output
    ) {
        methods[method] = { (caller: Caller, parameters: JSONValue?, sink: ReplySink) async throws -> JSONValue in
            if let parameters, case .object = parameters {
            } else if parameters != nil, parameters != .null {
                throw APIError.invalidParameter("parameters")
            }
            if let parameters { try Self.checkText(parameters, path: "") }
            let input: Input
            do { input = try VarlinkCoding.decode(Input.self, from: parameters == .null ? nil : parameters) } catch {
                throw APIError.invalidParameter(VarlinkCoding.parameterName(of: error))
            }
            let output = try await body(input, caller, sink)
            do { return try VarlinkCoding.encode(output) } catch {
                throw APIError.internalError("reply did not encode")
            }
        }
    }

    /// Refuses control and bidirectional-override characters in every string of a call's
    /// parameters (names, display names, services, terminals, hosts, tickets ...) before the
    /// method sees any of them: such a string is never stored, audited or logged. The error names
    /// the field by its path, e.g. `context.service`.
    static func checkText(_ value: JSONValue, path: String) throws(APIError) {
        switch value {
        case .string(let text):
            do { try SafeText.check(text, field: path) } catch {
                throw APIError.invalidInput(error.field, error.message)
            }
        case .array(let items):
            for item in items { try checkText(item, path: path) }
        case .object(let members):
            for (key, member) in members {
                try checkText(member, path: path.isEmpty ? SafeText.escaped(key) : path + "." + SafeText.escaped(key))
            }
        case .null, .bool, .number: break
        }
    }

    /// Runs `method`, or says it does not exist.
    func call(
        _ method: String, caller: Caller, parameters: JSONValue?, sink: ReplySink
    ) async throws(APIError) -> JSONValue {
        guard let handler = methods[method] else {
            let interface = method.split(separator: ".").dropLast().joined(separator: ".")
            if interface != "org.varlink.service" && interface != KioskAuthInterface.name {
                throw APIError.interfaceNotFound(interface)
            }
            throw APIError.methodNotFound(method)
        }
        do {
            return try await handler(caller, parameters, sink)
        } catch let error as APIError {
            throw error
        } catch {
            throw APIError.internalError("the call failed: \(type(of: error))")
        }
    }
}

struct ServiceInfo: Codable, Sendable, Equatable {
    var vendor: String
    var product: String
    var version: String
    var url: String
    var interfaces: [String]
}

struct InterfaceRequest: Codable, Sendable {
    var interface: String
}

struct InterfaceDescriptionReply: Codable, Sendable, Equatable {
    var description: String
}
