import KioskAuthProtocol

extension Dispatcher {
    /// The Fleet methods (see Authority+Fleet.swift and FleetAgent.swift).
    mutating func registerFleetMethods(authority: Authority) {
        register(KioskAuthMethod.fleetMigrate) { (input, caller, _) in
            try await authority.fleetMigrate(caller, input)
        }
        register(KioskAuthMethod.fleetCreate) { (input, caller, _) in
            try await authority.fleetCreate(caller, input)
        }
        register(KioskAuthMethod.fleetIssueJoinToken) { (input, caller, _) in
            try await authority.fleetIssueJoinToken(caller, input)
        }
        register(KioskAuthMethod.fleetJoin) { (input, caller, _) in
            try await authority.fleetJoin(caller, input)
        }
        register(KioskAuthMethod.fleetStatus) { (_, caller, _) in
            try await authority.fleetStatus(caller)
        }
        register(KioskAuthMethod.fleetSync) { (_, caller, _) in
            try await authority.fleetSync(caller)
            return Message.Empty()
        }
        register(KioskAuthMethod.fleetTerminals) { (_, caller, _) in
            try await authority.fleetTerminals(caller)
        }
        register(KioskAuthMethod.fleetRemoveTerminal) { (input, caller, _) in
            try await authority.fleetRemoveTerminal(caller, input)
        }
        register(KioskAuthMethod.fleetLeave) { (_, caller, _) in
            try await authority.fleetLeave(caller)
            return Message.Empty()
        }
    }
}
