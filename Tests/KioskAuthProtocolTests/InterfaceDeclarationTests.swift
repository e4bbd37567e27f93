import KioskAuthProtocol
import Testing

/// What differs between a declared method and the interface description; empty when they agree.
func mismatches(of method: AnyVarlinkMethod, in idl: IDLInterface) throws -> [String] {
    guard let declared = idl.methods[method.name] else { return ["\(method.name): not in the interface description"] }
    var problems: [String] = []
    let input = try decodedFields(of: method.input)
    let inputNames = Set(input.map(\.name))
    let fileInput = Set(declared.input.map(\.name))
    for name in fileInput.subtracting(inputNames).sorted() { problems.append("\(method.name) input lacks \(name)") }
    for name in inputNames.subtracting(fileInput).sorted() { problems.append("\(method.name) input has extra \(name)") }
    for field in input where !field.optional {
        if declared.input.first(where: { $0.name == field.name })?.optional == true {
            problems.append("\(method.name) input \(field.name) is required here but optional in the interface")
        }
    }
    let output = Set(try decodedFields(of: method.output).map(\.name))
    let unsent = Set(method.unsentOutputFields)
    let fileOutput = Set(declared.output.map(\.name))
    for name in fileOutput.subtracting(output).sorted() { problems.append("\(method.name) output lacks \(name)") }
    for name in output.subtracting(unsent).subtracting(fileOutput).sorted() {
        problems.append("\(method.name) output has extra \(name)")
    }
    for name in unsent.subtracting(output).union(unsent.intersection(fileOutput)).sorted() {
        problems.append("\(method.name) output: \(name) is not an unsent field")
    }
    let known = Set(KioskAuthError.all.map(\.qualifiedName) + serviceErrors.map(\.qualifiedName))
    for error in method.errors where !known.contains(error.qualifiedName) {
        problems.append("\(method.name) returns undeclared error \(error)")
    }
    return problems
}

private let serviceErrors = [
    VarlinkServiceError.interfaceNotFound, VarlinkServiceError.methodNotFound,
    VarlinkServiceError.methodNotImplemented, VarlinkServiceError.invalidParameter,
    VarlinkServiceError.permissionDenied, VarlinkServiceError.expectedMore,
]

@Suite("The typed interface declarations against io.kioskauth.varlink")
struct InterfaceDeclarationTests {
    let idl: IDLInterface

    init() throws { idl = try IDLInterface(try interfaceFileText()) }

    @Test func theFileParses_intoMethodsAndErrors() {
        #expect(idl.methods.count >= 40)
        #expect(idl.errors.count >= 60)
        #expect(idl.methods["AddPerson"]?.input.map(\.description) == ["name", "displayName?", "roles?", "uid?"])
        #expect(idl.errors["WrongPasscode"]?.map(\.description) == ["failures", "until?", "retryAfterSeconds?"])
    }

    @Test func everyMethod_isDeclared_andNothingElse() {
        let declared = KioskAuthMethod.all.map(\.name)
        #expect(Set(declared).count == declared.count, "a method is declared twice")
        #expect(Set(declared) == Set(idl.methods.keys))
    }

    @Test(arguments: KioskAuthMethod.all.map(\.name))
    func everyMethod_hasTheFieldsAndErrorsOfTheFile(name: String) throws {
        let method = try #require(KioskAuthMethod.all.first { $0.name == name })
        #expect(try mismatches(of: method, in: idl) == [])
    }

    @Test func everyError_isDeclared_withItsFields_andNothingElse() {
        let declared = Dictionary(KioskAuthError.all.map { ($0.name, $0.fields) }, uniquingKeysWith: { a, _ in a })
        #expect(declared.count == KioskAuthError.all.count, "an error is declared twice")
        #expect(Set(declared.keys) == Set(idl.errors.keys))
        for (name, fields) in idl.errors {
            #expect(declared[name] == fields.map(\.name), "\(name)")
        }
        #expect(KioskAuthError.all.allSatisfy { $0.interface == KioskAuthInterface.name })
    }

    @Test func everyErrorOfTheFile_isReturnedBySomeMethod() {
        let returned = Set((KioskAuthMethod.all.flatMap(\.errors) + KioskAuthError.anyCall).map(\.qualifiedName))
        let unused = KioskAuthError.all.filter { !returned.contains($0.qualifiedName) }.map(\.name)
        #expect(unused == [])
    }

    @Test func qualifiedNames_carryTheInterface() {
        #expect(KioskAuthMethod.addPerson.qualifiedName == "io.kioskauth.AddPerson")
        #expect(KioskAuthError.noSuchPerson.qualifiedName == "io.kioskauth.NoSuchPerson")
        #expect(VarlinkServiceError.expectedMore.qualifiedName == "org.varlink.service.ExpectedMore")
        #expect(VarlinkErrorName.own("NoSuchPerson") == KioskAuthError.noSuchPerson.qualifiedName)
    }
}

// The check itself, on a small interface and types that disagree with it.
private struct ProbeInput: Codable, Sendable {
    var name: String
    var extra: Int?
}

private struct ProbeOutput: Codable, Sendable {
    var person: String
    var never: Bool?
}

@Suite("The interface declaration check")
struct InterfaceDeclarationCheckTests {
    @Test func mismatchingFieldsAndErrors_areReported() throws {
        let idl = try IDLInterface(
            """
            interface io.example
            # A probe.
            method Probe(
              # Optional in the file, required in Swift.
              name: ?string,
              # Missing from Swift.
              reason: ?string
            ) -> (person: string, ticket: ?string)
            """)
        let bogus = VarlinkErrorDescriptor(interface: KioskAuthInterface.name, name: "Bogus", fields: [])
        let method = VarlinkMethod<ProbeInput, ProbeOutput>(
            "Probe", errors: [KioskAuthError.noSuchPerson, bogus], unsentOutputFields: ["never", "person"])
        #expect(
            try mismatches(of: method.erased, in: idl) == [
                "Probe input lacks reason",
                "Probe input has extra extra",
                "Probe input name is required here but optional in the interface",
                "Probe output lacks ticket",
                "Probe output: person is not an unsent field",
                "Probe returns undeclared error io.kioskauth.Bogus",
            ])
        let missing = VarlinkMethod<ProbeInput, ProbeOutput>("Absent", errors: [])
        #expect(try mismatches(of: missing.erased, in: idl) == ["Absent: not in the interface description"])
    }

    @Test func fieldRecorder_tellsRequiredFromOptional() throws {
        #expect(try decodedFields(of: ProbeInput.self).map(\.description) == ["name", "extra?"])
        #expect(
            try decodedFields(of: Message.AddPerson.self).map(\.description) == [
                "name", "displayName?", "roles?", "uid?",
            ])
    }
}
