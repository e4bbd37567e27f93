import Foundation
import KioskAuthProtocol

extension Dispatcher {
    /// Routes the identity-provider, connectivity and session methods.
    mutating func registerOnlineMethods(authority: Authority) {
        register(KioskAuthMethod.loginWithPassword) { (input, caller, _) in
            try await authority.loginWithPassword(caller, input)
        }
        register(KioskAuthMethod.checkOnlineLogin) { (input, caller, _) in
            try await authority.checkOnlineLogin(caller, input)
        }
        register(KioskAuthMethod.startDeviceLogin) { (input, caller, sink) in
            try await authority.startDeviceLogin(caller, input, sink: sink)
        }
        register(KioskAuthMethod.setBiometricOffer) { (input, caller, _) in
            Message.PersonReply(person: try await authority.setBiometricOffer(caller, input))
        }
        register(KioskAuthMethod.getConnectivity) { (input, caller, _) in
            try await authority.connectivity(caller, people: input.people ?? false)
        }
        register(KioskAuthMethod.openSession) { (input, caller, _) in
            Message.SessionReply(session: try await authority.openSession(caller, input))
        }
        register(KioskAuthMethod.closeSession) { (input, caller, _) in
            try await authority.closeSession(caller, input.id)
            return Message.Empty()
        }
        register(KioskAuthMethod.lockSession) { (input, caller, _) in
            Message.SessionReply(session: try await authority.lockSession(caller, input.id))
        }
        register(KioskAuthMethod.reportActivity) { (input, caller, _) in
            Message.SessionReply(session: try await authority.reportActivity(caller, input.id))
        }
        register(KioskAuthMethod.authenticateSession) { (input, caller, _) in
            Message.SessionReply(session: try await authority.authenticateSession(caller, input))
        }
        register(KioskAuthMethod.stepUp) { (input, caller, _) in
            try await authority.stepUp(caller, input)
        }
        register(KioskAuthMethod.listSessions) { (input, caller, _) in
            Message.Sessions(sessions: try await authority.listSessions(caller, input))
        }
        register(KioskAuthMethod.endSessions) { (input, caller, _) in
            Message.EndedSessions(ended: try await authority.endSessions(caller, input.name))
        }
        register(KioskAuthMethod.getSessionToken) { (input, caller, _) in
            try await authority.sessionToken(caller, input.id)
        }
        register(KioskAuthMethod.subscribe) { (_, caller, sink) in
            guard sink.wantsMore else { throw APIError.expectedMore }
            let hub = authority.services.events
            guard let (id, events) = hub.subscribe() else { throw APIError.shuttingDown }
            defer { hub.unsubscribe(id) }
            try await sink.progress(
                Message.Event(event: EventRecord(kind: "subscribed", time: Authority.timestamp(Date()))))
            for await event in events where await authority.mayReceive(caller, event) {
                try await sink.progress(Message.Event(event: event))
            }
            return Message.Event(event: EventRecord(kind: "shutdown", time: Authority.timestamp(Date())))
        }
    }
}
