// libFuzzer target for the protocol's JSON parser and message decoding (KioskAuthProtocol),
// built by fuzz/run with `swiftc -sanitize=fuzzer,address` from the module's sources.
//
// Each input is one message as the daemon reads it off the socket (without its NUL). It is
// parsed; what parses must serialize and parse back to the same value; then it is decoded as a
// call, its parameters as each method's input, and as the replies clients decode. Decoding
// errors are fine; a trap, a sanitizer report, a hang or a round-trip mismatch is a finding.

func decodeAll(_ value: JSONValue?) {
    _ = try? VarlinkCoding.decode(Message.Empty.self, from: value)
    _ = try? VarlinkCoding.decode(Message.Name.self, from: value)
    _ = try? VarlinkCoding.decode(Message.AddPerson.self, from: value)
    _ = try? VarlinkCoding.decode(Message.SuspendPerson.self, from: value)
    _ = try? VarlinkCoding.decode(Message.BindAccount.self, from: value)
    _ = try? VarlinkCoding.decode(Message.SetPasscode.self, from: value)
    _ = try? VarlinkCoding.decode(Message.VerifyPasscode.self, from: value)
    _ = try? VarlinkCoding.decode(Message.GetAudit.self, from: value)
    _ = try? VarlinkCoding.decode(Message.VerifyAudit.self, from: value)
    _ = try? VarlinkCoding.decode(Message.EnrollFinger.self, from: value)
    _ = try? VarlinkCoding.decode(Message.RemoveFinger.self, from: value)
    _ = try? VarlinkCoding.decode(Message.VerifyFinger.self, from: value)
    _ = try? VarlinkCoding.decode(Message.Identify.self, from: value)
    _ = try? VarlinkCoding.decode(Message.CheckActivationCode.self, from: value)
    _ = try? VarlinkCoding.decode(Message.CompleteActivation.self, from: value)
    _ = try? VarlinkCoding.decode(Message.CheckAccount.self, from: value)
    _ = try? VarlinkCoding.decode(Message.LoginWithPassword.self, from: value)
    _ = try? VarlinkCoding.decode(Message.OnlineLogin.self, from: value)
    _ = try? VarlinkCoding.decode(Message.CheckOnlineLogin.self, from: value)
    _ = try? VarlinkCoding.decode(Message.SetBiometricOffer.self, from: value)
    _ = try? VarlinkCoding.decode(Message.GetConnectivity.self, from: value)
    _ = try? VarlinkCoding.decode(Message.OpenSession.self, from: value)
    _ = try? VarlinkCoding.decode(Message.SessionID.self, from: value)
    _ = try? VarlinkCoding.decode(Message.AuthenticateSession.self, from: value)
    _ = try? VarlinkCoding.decode(Message.StepUp.self, from: value)
    _ = try? VarlinkCoding.decode(Message.ListSessions.self, from: value)
    _ = try? VarlinkCoding.decode(CallerContext.self, from: value)
    // What clients (kioskauthctl) decode from replies.
    _ = try? VarlinkCoding.decode(Message.Status.self, from: value)
    _ = try? VarlinkCoding.decode(Message.PersonReply.self, from: value)
    _ = try? VarlinkCoding.decode(Message.ScanReply.self, from: value)
    _ = try? VarlinkCoding.decode(Message.Readers.self, from: value)
    _ = try? VarlinkCoding.decode(Message.AuditEvents.self, from: value)
    _ = try? VarlinkCoding.decode(Message.Sessions.self, from: value)
    do {
        _ = try VarlinkCoding.decode(Message.VerifyPasscode.self, from: value)
    } catch {
        _ = VarlinkCoding.parameterName(of: error)
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = UnsafeBufferPointer(start: data, count: size)
    guard let value = try? JSONValue.parse(bytes) else { return 0 }
    if let written = try? value.serialized() {
        guard let again = try? JSONValue.parse(written), again == value else {
            fatalError("round trip changed the value: \(String(decoding: written, as: UTF8.self))")
        }
    }
    if let call = try? JSONValueDecoder().decode(VarlinkCall.self, from: value) {
        decodeAll(call.parameters)
        _ = try? VarlinkCoding.frame(call)
    }
    if let reply = try? JSONValueDecoder().decode(VarlinkReply.self, from: value) {
        decodeAll(reply.parameters)
    }
    return 0
}
