import FoundationEssentials
import KioskAuthProtocol

extension Dispatcher {
    /// Routes the identity-provider, connectivity and session methods.
    mutating func registerOnlineMethods(authority: Authority) {
        register(KioskAuthMethod.loginWithPassword) { (input, caller, _) in
            try await authority.online.loginWithPassword(caller, input)
        }
        register(KioskAuthMethod.checkOnlineLogin) { (input, caller, _) in
            try await authority.online.checkOnlineLogin(caller, input)
        }
        register(KioskAuthMethod.startDeviceLogin) { (input, caller, sink) in
            try await authority.online.startDeviceLogin(caller, input, sink: sink)
        }
        register(KioskAuthMethod.setBiometricOffer) { (input, caller, _) in
            Message.PersonReply(person: try await authority.online.setBiometricOffer(caller, input))
        }
        register(KioskAuthMethod.getConnectivity) { (input, caller, _) in
            try await authority.online.connectivity(caller, people: input.people ?? false)
        }
        register(KioskAuthMethod.openSession) { (input, caller, _) in
            Message.SessionReply(session: try await authority.online.openSession(caller, input))
        }
        register(KioskAuthMethod.closeSession) { (input, caller, _) in
            try await authority.online.closeSession(caller, input.id)
            return Message.Empty()
        }
        register(KioskAuthMethod.lockSession) { (input, caller, _) in
            Message.SessionReply(session: try await authority.online.lockSession(caller, input.id))
        }
        register(KioskAuthMethod.reportActivity) { (input, caller, _) in
            Message.SessionReply(session: try await authority.online.reportActivity(caller, input.id))
        }
        register(KioskAuthMethod.authenticateSession) { (input, caller, _) in
            Message.SessionReply(session: try await authority.online.authenticateSession(caller, input))
        }
        register(KioskAuthMethod.stepUp) { (input, caller, _) in
            try await authority.online.stepUp(caller, input)
        }
        register(KioskAuthMethod.listSessions) { (input, caller, _) in
            Message.Sessions(sessions: try await authority.online.listSessions(caller, input))
        }
        register(KioskAuthMethod.endSessions) { (input, caller, _) in
            Message.EndedSessions(ended: try await authority.online.endSessions(caller, input.name))
        }
        register(KioskAuthMethod.getSessionToken) { (input, caller, _) in
            try await authority.online.sessionToken(caller, input.id)
        }
        register(KioskAuthMethod.subscribe) { (_, caller, sink) in
            guard sink.wantsMore else { throw APIError.expectedMore }
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
