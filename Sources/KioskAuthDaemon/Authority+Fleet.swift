import FoundationEssentials
import KioskAuthCore
import KioskAuthFleet
import KioskAuthProtocol

extension Authority {
    /// The longest a join token may be valid.
    static let maximumJoinTokenSeconds = 7 * 86400

    /// Runs a Fleet method for root and the admin group only: anyone else is refused
    /// `PermissionDenied`, audited. The work runs on the fleet agent, never on this actor, so a
    /// slow directory holds up no unlock; its outcome is audited here.
    func fleetCall<T: Sendable>(
        _ caller: Caller, action: AuditAction, audits success: Bool = true,
        _ body: @Sendable (FleetAgent) async throws(APIError) -> T
    ) async throws(APIError) -> T {
        guard access.isAdmin(caller) else {
            audit(caller, action: action, result: .refused, detail: "caller is not an admin")
            throw APIError.permissionDenied("\(action) needs root or membership in \(access.adminGroup)")
        }
        do {
            let result = try await body(fleet)
            if success { audit(caller, action: action, result: .success) }
            return result
        } catch {
            audit(caller, action: action, result: .failure, detail: "\(error.name): \(error.parameters)")
            throw error
        }
    }

    /// Migrates the directory as its owner; the URL and password are used once and not kept,
    /// and neither is audited (the URL may name a host, never a password: the endpoint refuses
    /// one).
    func fleetMigrate(_ caller: Caller, _ input: Message.FleetMigrate) async throws(APIError) -> Message.FleetMigrated {
        try await fleetCall(caller, action: .fleetMigrate) { agent throws(APIError) in
            Message.FleetMigrated(
                version: try await agent.migrate(directory: input.directory, password: input.password))
        }
    }

    func fleetCreate(_ caller: Caller, _ input: Message.FleetCreate) async throws(APIError) -> Message.FleetCreated {
        try await fleetCall(caller, action: .fleetCreate) { agent throws(APIError) in
            Message.FleetCreated(terminalId: try await agent.create(directory: input.directory, name: input.name))
        }
    }

    func fleetIssueJoinToken(
        _ caller: Caller, _ input: Message.FleetIssueJoinToken
    ) async throws(APIError) -> Message.FleetJoinToken {
        let seconds = input.validSeconds ?? 3600
        guard (1...Self.maximumJoinTokenSeconds).contains(seconds) else {
            throw APIError.invalidInput("validSeconds", "1 to \(Self.maximumJoinTokenSeconds) seconds")
        }
        return try await fleetCall(caller, action: .fleetToken) { agent throws(APIError) in
            Message.FleetJoinToken(token: try await agent.issueToken(validSeconds: seconds))
        }
    }

    func fleetJoin(_ caller: Caller, _ input: Message.FleetJoin) async throws(APIError) -> Message.FleetJoined {
        try await fleetCall(caller, action: .fleetJoin) { agent throws(APIError) in
            let (id, state) = try await agent.join(directory: input.directory, tokenText: input.token, name: input.name)
            return Message.FleetJoined(terminalId: id, state: state)
        }
    }

    func fleetStatus(_ caller: Caller) async throws(APIError) -> Message.FleetStatus {
        try await fleetCall(caller, action: .fleetStatus, audits: false) { agent throws(APIError) in
            try await agent.status()
        }
    }

    func fleetSync(_ caller: Caller) async throws(APIError) {
        try await fleetCall(caller, action: .fleetSync, audits: false) { agent throws(APIError) in
            try await agent.sync()
        }
    }

    func fleetTerminals(_ caller: Caller) async throws(APIError) -> Message.FleetTerminals {
        try await fleetCall(caller, action: .fleetTerminals, audits: false) { agent throws(APIError) in
            let (terminals, this) = try await agent.terminals()
            return Message.FleetTerminals(
                terminals: terminals.map { terminal in
                    let id = terminal.id.uuidString.lowercased()
                    return Message.FleetTerminal(
                        terminalId: id, name: terminal.name, state: terminal.state,
                        readerDriver: terminal.readerDriver, readerDeviceType: terminal.readerDeviceType,
                        matchOnChip: terminal.isMatchOnChip, joinedAt: ISO8601.string(terminal.joinedAt),
                        removedAt: terminal.removedAt.map { ISO8601.string($0) },
                        lastSeenAt: terminal.lastSeenAt.map { ISO8601.string($0) },
                        isThisTerminal: id == this)
                })
        }
    }

    /// Removes another terminal and rotates the data key; audited with the terminal removed.
    func fleetRemoveTerminal(
        _ caller: Caller, _ input: Message.FleetRemoveTerminal
    ) async throws(APIError) -> Message.FleetTerminalRemoved {
        let removal = try await fleetCall(caller, action: .fleetRemove, audits: false) {
            agent throws(APIError) in
            let named = input.terminal.trimmingWhitespace(newlines: false)
            guard !named.isEmpty, named.count <= 256, !named.contains(where: { $0.isNewline || $0 == "\u{0}" })
            else { throw APIError.invalidInput("terminal", "a terminal id or name") }
            return try await agent.removeTerminal(named)
        }
        let id = removal.terminal.id.uuidString.lowercased()
        let rotation =
            removal.rotationOwed
            ? "a new data-key generation is still owed (the next member to sync publishes it)"
            : removal.rotated
                ? "published data-key generation \(removal.generation)"
                : "data-key generation \(removal.generation) was published by another member"
        audit(
            caller, action: .fleetRemove, result: .success,
            detail: "removed terminal \(removal.terminal.name) (\(id)); \(rotation)")
        return Message.FleetTerminalRemoved(
            terminalId: id, name: removal.terminal.name, generation: Int(removal.generation), rotated: removal.rotated,
            rotationOwed: removal.rotationOwed)
    }

    func fleetLeave(_ caller: Caller) async throws(APIError) {
        try await fleetCall(caller, action: .fleetLeave) { agent throws(APIError) in
            try await agent.leave()
        }
    }
}
