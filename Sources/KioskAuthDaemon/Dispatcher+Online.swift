import Foundation
import KioskAuthProtocol

extension Dispatcher {
    /// Routes the identity-provider, connectivity and session methods.
    mutating func registerOnlineMethods(authority: Authority) {
        let prefix = KioskAuthInterface.name + "."
        register(prefix + "LoginWithPassword") { (input: Message.LoginWithPassword, caller, _) in
            try await authority.online.loginWithPassword(caller, input)
        }
        register(prefix + "CheckOnlineLogin") { (input: Message.CheckOnlineLogin, caller, _) in
            try await authority.online.checkOnlineLogin(caller, input)
        }
        register(prefix + "StartDeviceLogin") { (input: Message.StartDeviceLogin, caller, sink) in
            try await authority.online.startDeviceLogin(caller, input, sink: sink)
        }
        register(prefix + "SetBiometricOffer") { (input: Message.SetBiometricOffer, caller, _) in
            Message.PersonReply(person: try await authority.online.setBiometricOffer(caller, input))
        }
        register(prefix + "GetConnectivity") { (input: Message.GetConnectivity, caller, _) in
            try await authority.online.connectivity(caller, people: input.people ?? false)
        }
        register(prefix + "OpenSession") { (input: Message.OpenSession, caller, _) in
            Message.SessionReply(session: try await authority.online.openSession(caller, input))
        }
        register(prefix + "CloseSession") { (input: Message.SessionID, caller, _) in
            try await authority.online.closeSession(caller, input.id)
            return Message.Empty()
        }
        register(prefix + "LockSession") { (input: Message.SessionID, caller, _) in
            Message.SessionReply(session: try await authority.online.lockSession(caller, input.id))
        }
        register(prefix + "ReportActivity") { (input: Message.SessionID, caller, _) in
            Message.SessionReply(session: try await authority.online.reportActivity(caller, input.id))
        }
        register(prefix + "AuthenticateSession") { (input: Message.AuthenticateSession, caller, _) in
            Message.SessionReply(session: try await authority.online.authenticateSession(caller, input))
        }
        register(prefix + "StepUp") { (input: Message.StepUp, caller, _) in
            try await authority.online.stepUp(caller, input)
        }
        register(prefix + "ListSessions") { (input: Message.ListSessions, caller, _) in
            Message.Sessions(sessions: try await authority.online.listSessions(caller, input))
        }
        register(prefix + "EndSessions") { (input: Message.Name, caller, _) in
            Message.EndedSessions(ended: try await authority.online.endSessions(caller, input.name))
        }
        register(prefix + "GetSessionToken") { (input: Message.SessionID, caller, _) in
            try await authority.online.sessionToken(caller, input.id)
        }
        register(prefix + "Subscribe") { (_: Message.Empty, caller, sink) in
            guard sink.wantsMore else { throw APIError(VarlinkErrorName.expectedMore) }
            let hub = authority.services.events
            guard let (id, events) = hub.subscribe() else { throw APIError.shuttingDown }
            defer { hub.unsubscribe(id) }
            try await sink.progress(
                Message.Event(event: EventRecord(kind: "subscribed", time: OnlineAuthority.timestamp(Date()))))
            for await event in events where await authority.online.mayReceive(caller, event) {
                try await sink.progress(Message.Event(event: event))
            }
            return Message.Event(event: EventRecord(kind: "shutdown", time: OnlineAuthority.timestamp(Date())))
        }
    }
}
