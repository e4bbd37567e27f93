extension Message {
    /// `FleetMigrate`'s input: the owner's URL and password, used once and forgotten.
    public struct FleetMigrate: Codable, Sendable {
        public var directory: String
        public var password: String?
        public init(directory: String, password: String? = nil) {
            self.directory = directory
            self.password = password
        }
    }

    /// `FleetMigrate`'s reply.
    public struct FleetMigrated: Codable, Sendable {
        public var version: Int
        public init(version: Int) { self.version = version }
    }

    /// `FleetCreate`'s input.
    public struct FleetCreate: Codable, Sendable {
        public var directory: String
        public var name: String?
        public init(directory: String, name: String? = nil) {
            self.directory = directory
            self.name = name
        }
    }

    /// `FleetCreate`'s reply.
    public struct FleetCreated: Codable, Sendable {
        public var terminalId: String
        public init(terminalId: String) { self.terminalId = terminalId }
    }

    /// `FleetIssueJoinToken`'s input.
    public struct FleetIssueJoinToken: Codable, Sendable {
        public var validSeconds: Int?
        public init(validSeconds: Int? = nil) { self.validSeconds = validSeconds }
    }

    /// `FleetIssueJoinToken`'s reply.
    public struct FleetJoinToken: Codable, Sendable {
        public var token: String
        public init(token: String) { self.token = token }
    }

    /// `FleetJoin`'s input.
    public struct FleetJoin: Codable, Sendable {
        public var directory: String
        public var token: String
        public var name: String?
        public init(directory: String, token: String, name: String? = nil) {
            self.directory = directory
            self.token = token
            self.name = name
        }
    }

    /// `FleetJoin`'s reply.
    public struct FleetJoined: Codable, Sendable {
        public var terminalId: String
        public var state: String
        public init(terminalId: String, state: String) {
            self.terminalId = terminalId
            self.state = state
        }
    }

    /// One terminal as `FleetTerminals` lists it.
    public struct FleetTerminal: Codable, Sendable, Equatable {
        public var terminalId: String
        public var name: String
        public var state: String
        public var readerDriver: String?
        public var readerDeviceType: String?
        public var matchOnChip: Bool
        public var joinedAt: String
        public var removedAt: String?
        public var lastSeenAt: String?
        /// Whether this is the terminal answering.
        public var isThisTerminal: Bool

        public init(
            terminalId: String, name: String, state: String, readerDriver: String?, readerDeviceType: String?,
            matchOnChip: Bool, joinedAt: String, removedAt: String?, lastSeenAt: String?, isThisTerminal: Bool
        ) {
            self.terminalId = terminalId
            self.name = name
            self.state = state
            self.readerDriver = readerDriver
            self.readerDeviceType = readerDeviceType
            self.matchOnChip = matchOnChip
            self.joinedAt = joinedAt
            self.removedAt = removedAt
            self.lastSeenAt = lastSeenAt
            self.isThisTerminal = isThisTerminal
        }
    }

    /// `FleetTerminals`' reply.
    public struct FleetTerminals: Codable, Sendable {
        public var terminals: [FleetTerminal]
        public init(terminals: [FleetTerminal]) { self.terminals = terminals }
    }

    /// `FleetRemoveTerminal`'s input: a terminal id, or the name of a terminal not yet removed.
    public struct FleetRemoveTerminal: Codable, Sendable {
        public var terminal: String
        public init(terminal: String) { self.terminal = terminal }
    }

    /// `FleetRemoveTerminal`'s reply.
    public struct FleetTerminalRemoved: Codable, Sendable {
        public var terminalId: String
        public var name: String
        /// The newest data-key generation this terminal holds afterwards.
        public var generation: Int
        /// Whether this call published the generation the removal owed.
        public var rotated: Bool
        /// Whether a new generation is still owed (the rotation failed; any member pays it).
        public var rotationOwed: Bool
        public init(terminalId: String, name: String, generation: Int, rotated: Bool, rotationOwed: Bool) {
            self.terminalId = terminalId
            self.name = name
            self.generation = generation
            self.rotated = rotated
            self.rotationOwed = rotationOwed
        }
    }

    /// `FleetStatus`' reply.
    public struct FleetStatus: Codable, Sendable, Equatable {
        public var configured: Bool
        public var state: String?
        public var terminalId: String?
        public var directory: String?
        public var reachable: Bool
        public var cursor: Int
        public var head: Int
        public var lag: Int
        public var queuedPushes: Int
        public var generation: Int
        public var lastSyncAt: String?
        public var lastError: String?
        public var rejectedChanges: Int
        public var lastRejection: String?

        public init(
            configured: Bool, state: String? = nil, terminalId: String? = nil, directory: String? = nil,
            reachable: Bool = false, cursor: Int = 0, head: Int = 0, lag: Int = 0, queuedPushes: Int = 0,
            generation: Int = 0, lastSyncAt: String? = nil, lastError: String? = nil, rejectedChanges: Int = 0,
            lastRejection: String? = nil
        ) {
            self.rejectedChanges = rejectedChanges
            self.lastRejection = lastRejection
            self.configured = configured
            self.state = state
            self.terminalId = terminalId
            self.directory = directory
            self.reachable = reachable
            self.cursor = cursor
            self.head = head
            self.lag = lag
            self.queuedPushes = queuedPushes
            self.generation = generation
            self.lastSyncAt = lastSyncAt
            self.lastError = lastError
        }
    }
}
