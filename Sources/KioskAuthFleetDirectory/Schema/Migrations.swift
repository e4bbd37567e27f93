/// The directory's schema, as numbered migrations. A migration is a list of statements (the
/// extended query protocol takes one statement at a time) applied in one transaction together
/// with its row in `fleet_schema`. Never edit a migration that has shipped: add the next one.
/// docs/fleet.md §2 explains every table.
public struct FleetMigration: Sendable {
    /// The version this migration brings the schema to.
    public let version: Int32
    /// What it does, for `fleet_schema.description`.
    public let summary: String
    /// The statements, in order.
    public let statements: [String]

    /// Every migration, oldest first.
    public static let all: [FleetMigration] = [v1, v2, v3, v4]

    /// The newest schema version this build knows.
    public static var latestVersion: Int32 { all.last?.version ?? 0 }
}

extension FleetMigration {
    /// The directory foundation: terminals, keys, people, secrets, the change feed, pushes,
    /// fleet-wide passcode failures and the audit append table.
    static let v1 = FleetMigration(
        version: 1,
        summary: "directory foundation: terminals, keys, people, secrets, change feed, pushes, failures, audit",
        statements: [
            // The change clock: one row whose lock every writing transaction takes at its first
            // change and holds until it commits, so change ids are handed out in commit order
            // and a reader that sees id n also sees every id below n (docs/fleet.md §4).
            """
            CREATE TABLE change_clock (
                singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                last_id bigint NOT NULL
            )
            """,
            "INSERT INTO change_clock (singleton, last_id) VALUES (true, 0)",
            """
            CREATE FUNCTION fleet_next_change_id() RETURNS bigint
            LANGUAGE plpgsql VOLATILE AS $$
            DECLARE
                next_id bigint;
            BEGIN
                UPDATE change_clock SET last_id = last_id + 1 RETURNING last_id INTO next_id;
                RETURN next_id;
            END
            $$
            """,
            // The change feed. `body` is the row as it is after the change (NULL for a deletion);
            // secrets in it are the sealed ciphertexts of the source row, never plaintext.
            """
            CREATE TABLE changes (
                change_id bigint PRIMARY KEY DEFAULT fleet_next_change_id(),
                entity text NOT NULL,
                entity_key text NOT NULL,
                deleted boolean NOT NULL DEFAULT false,
                body jsonb,
                committed_at timestamptz NOT NULL DEFAULT now()
            )
            """,
            "CREATE INDEX changes_entity ON changes (entity, entity_key)",
            """
            CREATE FUNCTION fleet_record_change() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP = 'DELETE' THEN
                    INSERT INTO changes (entity, entity_key, deleted, body)
                    VALUES (TG_TABLE_NAME, to_jsonb(OLD) ->> TG_ARGV[0], true, NULL);
                    RETURN OLD;
                END IF;
                INSERT INTO changes (entity, entity_key, deleted, body)
                VALUES (TG_TABLE_NAME, to_jsonb(NEW) ->> TG_ARGV[0], false, to_jsonb(NEW));
                RETURN NEW;
            END
            $$
            """,
            // NOTIFY is delivered at commit and identical payloads of one transaction are
            // folded into one, so a push of any size wakes each listener once.
            """
            CREATE FUNCTION fleet_notify_change() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_notify('kioskauth_fleet_changes', '');
                RETURN NULL;
            END
            $$
            """,
            """
            CREATE TRIGGER changes_notify AFTER INSERT ON changes
            FOR EACH STATEMENT EXECUTE FUNCTION fleet_notify_change()
            """,

            // Terminals. The public key is the X25519 half of the key pair whose private half is
            // the terminal's systemd credential. `join_proof` is HMAC(join secret, id ‖ key): a
            // member admits a pending terminal only if the proof opens with a token it issued.
            """
            CREATE TABLE terminals (
                terminal_id uuid PRIMARY KEY,
                name text NOT NULL,
                public_key bytea NOT NULL CHECK (octet_length(public_key) = 32),
                reader_driver text,
                reader_device_type text,
                match_on_chip boolean NOT NULL DEFAULT false,
                state text NOT NULL CHECK (state IN ('pending', 'member', 'removed')),
                join_token_id uuid,
                join_proof bytea,
                joined_at timestamptz NOT NULL DEFAULT now(),
                removed_at timestamptz
            )
            """,
            """
            CREATE TRIGGER terminals_change AFTER INSERT OR UPDATE OF state ON terminals
            FOR EACH ROW EXECUTE FUNCTION fleet_record_change('terminal_id')
            """,
            // Where each terminal's cursor stands, for `fleet status`; not part of the feed.
            """
            CREATE TABLE terminal_sync (
                terminal_id uuid PRIMARY KEY REFERENCES terminals,
                cursor bigint NOT NULL DEFAULT 0,
                last_seen_at timestamptz NOT NULL DEFAULT now()
            )
            """,
            // One-time join tokens: only SHA-256 of the secret is stored.
            """
            CREATE TABLE join_tokens (
                token_id uuid PRIMARY KEY,
                secret_hash bytea NOT NULL CHECK (octet_length(secret_hash) = 32),
                issued_by uuid REFERENCES terminals,
                issued_at timestamptz NOT NULL DEFAULT now(),
                expires_at timestamptz NOT NULL,
                used_at timestamptz,
                used_by uuid
            )
            """,

            // Data-key generations and each generation wrapped to each member's public key.
            """
            CREATE TABLE data_keys (
                generation integer PRIMARY KEY CHECK (generation > 0),
                created_by uuid REFERENCES terminals,
                created_at timestamptz NOT NULL DEFAULT now(),
                reason text NOT NULL
            )
            """,
            """
            CREATE TABLE wrapped_keys (
                terminal_id uuid NOT NULL REFERENCES terminals,
                generation integer NOT NULL REFERENCES data_keys,
                encapsulated_key bytea NOT NULL,
                ciphertext bytea NOT NULL,
                wrap_id text GENERATED ALWAYS AS (terminal_id::text || '/' || generation::text) STORED,
                PRIMARY KEY (terminal_id, generation)
            )
            """,
            """
            CREATE TRIGGER wrapped_keys_change AFTER INSERT OR UPDATE OR DELETE ON wrapped_keys
            FOR EACH ROW EXECUTE FUNCTION fleet_record_change('wrap_id')
            """,

            // People and their secrets. `sealed` columns hold FleetSealer output only.
            """
            CREATE TABLE people (
                person_id uuid PRIMARY KEY,
                name text NOT NULL UNIQUE,
                role text NOT NULL,
                uid integer,
                state text NOT NULL CHECK (state IN ('active', 'suspended', 'removed')),
                updated_at timestamptz NOT NULL DEFAULT now(),
                updated_by uuid REFERENCES terminals
            )
            """,
            """
            CREATE TRIGGER people_change AFTER INSERT OR UPDATE OR DELETE ON people
            FOR EACH ROW EXECUTE FUNCTION fleet_record_change('person_id')
            """,
            """
            CREATE TABLE passcode_verifiers (
                person_id uuid PRIMARY KEY REFERENCES people,
                generation integer NOT NULL REFERENCES data_keys,
                sealed bytea NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now(),
                updated_by uuid REFERENCES terminals
            )
            """,
            """
            CREATE TRIGGER passcode_verifiers_change AFTER INSERT OR UPDATE OR DELETE ON passcode_verifiers
            FOR EACH ROW EXECUTE FUNCTION fleet_record_change('person_id')
            """,
            // A template is usable only by a terminal whose reader has the same driver and
            // device type; match-on-chip readers enrol locally and never read this table.
            """
            CREATE TABLE templates (
                template_id uuid PRIMARY KEY,
                person_id uuid NOT NULL REFERENCES people,
                finger text NOT NULL,
                driver text NOT NULL,
                device_type text NOT NULL,
                generation integer NOT NULL REFERENCES data_keys,
                sealed bytea NOT NULL,
                enrolled_at timestamptz NOT NULL DEFAULT now(),
                enrolled_by uuid REFERENCES terminals
            )
            """,
            "CREATE INDEX templates_person ON templates (person_id)",
            """
            CREATE TRIGGER templates_change AFTER INSERT OR UPDATE OR DELETE ON templates
            FOR EACH ROW EXECUTE FUNCTION fleet_record_change('template_id')
            """,

            // Fleet-wide passcode failures: each terminal's count since the last reset, and their
            // sum per person, which is what the feed carries to every terminal.
            """
            CREATE TABLE passcode_failures (
                person_id uuid NOT NULL REFERENCES people,
                terminal_id uuid NOT NULL REFERENCES terminals,
                failures integer NOT NULL CHECK (failures >= 0),
                updated_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (person_id, terminal_id)
            )
            """,
            """
            CREATE TABLE person_lockout (
                person_id uuid PRIMARY KEY REFERENCES people,
                fleet_failures integer NOT NULL CHECK (fleet_failures >= 0),
                updated_at timestamptz NOT NULL DEFAULT now()
            )
            """,
            """
            CREATE TRIGGER person_lockout_change AFTER INSERT OR UPDATE ON person_lockout
            FOR EACH ROW EXECUTE FUNCTION fleet_record_change('person_id')
            """,

            // Pushes applied, by idempotency key: a retried push finds its key and changes nothing.
            """
            CREATE TABLE applied_pushes (
                idempotency_key uuid PRIMARY KEY,
                terminal_id uuid NOT NULL REFERENCES terminals,
                operations integer NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )
            """,
            // The fleet's audit trail, appended by terminals; each event carries its own key so
            // an event resent in another batch is still stored once.
            """
            CREATE TABLE audit_events (
                event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                idempotency_key uuid NOT NULL UNIQUE,
                terminal_id uuid NOT NULL REFERENCES terminals,
                terminal_sequence bigint NOT NULL,
                occurred_at timestamptz NOT NULL,
                person text,
                action text NOT NULL,
                result text NOT NULL,
                received_at timestamptz NOT NULL DEFAULT now()
            )
            """,
            // A push, applied in one statement so the change-clock lock is held only while the
            // server applies it, never across a network round trip. Returns false when the
            // idempotency key was applied before (nothing is changed then). Only a member may
            // push. Secrets arrive sealed, in base64.
            """
            CREATE FUNCTION fleet_apply_push(p_key uuid, p_terminal uuid, p_ops jsonb) RETURNS boolean
            LANGUAGE plpgsql AS $$
            DECLARE
                op jsonb;
            BEGIN
                IF NOT EXISTS (SELECT 1 FROM terminals WHERE terminal_id = p_terminal AND state = 'member') THEN
                    RAISE EXCEPTION 'terminal % is not a fleet member', p_terminal;
                END IF;
                INSERT INTO applied_pushes (idempotency_key, terminal_id, operations)
                VALUES (p_key, p_terminal, jsonb_array_length(p_ops))
                ON CONFLICT (idempotency_key) DO NOTHING;
                IF NOT FOUND THEN
                    RETURN false;
                END IF;
                FOR op IN SELECT value FROM jsonb_array_elements(p_ops) LOOP
                    CASE op ->> 'op'
                    WHEN 'person' THEN
                        INSERT INTO people (person_id, name, role, uid, state, updated_by)
                        VALUES ((op ->> 'person')::uuid, op ->> 'name', op ->> 'role', (op ->> 'uid')::integer,
                                op ->> 'state', p_terminal)
                        ON CONFLICT (person_id) DO UPDATE SET name = EXCLUDED.name, role = EXCLUDED.role,
                            uid = EXCLUDED.uid, state = EXCLUDED.state, updated_at = now(), updated_by = p_terminal;
                    WHEN 'verifier' THEN
                        INSERT INTO passcode_verifiers (person_id, generation, sealed, updated_by)
                        VALUES ((op ->> 'person')::uuid, (op ->> 'generation')::integer,
                                decode(op ->> 'sealed', 'base64'), p_terminal)
                        ON CONFLICT (person_id) DO UPDATE SET generation = EXCLUDED.generation,
                            sealed = EXCLUDED.sealed, updated_at = now(), updated_by = p_terminal;
                    WHEN 'template' THEN
                        INSERT INTO templates (template_id, person_id, finger, driver, device_type, generation,
                                               sealed, enrolled_by)
                        VALUES ((op ->> 'template')::uuid, (op ->> 'person')::uuid, op ->> 'finger',
                                op ->> 'driver', op ->> 'device_type', (op ->> 'generation')::integer,
                                decode(op ->> 'sealed', 'base64'), p_terminal)
                        ON CONFLICT (template_id) DO UPDATE SET finger = EXCLUDED.finger,
                            driver = EXCLUDED.driver, device_type = EXCLUDED.device_type,
                            generation = EXCLUDED.generation, sealed = EXCLUDED.sealed,
                            enrolled_at = now(), enrolled_by = p_terminal;
                    WHEN 'remove_template' THEN
                        DELETE FROM templates WHERE template_id = (op ->> 'template')::uuid;
                    WHEN 'passcode_failures' THEN
                        INSERT INTO passcode_failures (person_id, terminal_id, failures)
                        VALUES ((op ->> 'person')::uuid, p_terminal, (op ->> 'count')::integer)
                        ON CONFLICT (person_id, terminal_id) DO UPDATE
                            SET failures = passcode_failures.failures + EXCLUDED.failures, updated_at = now();
                        INSERT INTO person_lockout (person_id, fleet_failures)
                        VALUES ((op ->> 'person')::uuid, (op ->> 'count')::integer)
                        ON CONFLICT (person_id) DO UPDATE
                            SET fleet_failures = person_lockout.fleet_failures + EXCLUDED.fleet_failures,
                                updated_at = now();
                    WHEN 'passcode_reset' THEN
                        DELETE FROM passcode_failures WHERE person_id = (op ->> 'person')::uuid;
                        INSERT INTO person_lockout (person_id, fleet_failures)
                        VALUES ((op ->> 'person')::uuid, 0)
                        ON CONFLICT (person_id) DO UPDATE SET fleet_failures = 0, updated_at = now();
                    WHEN 'audit' THEN
                        INSERT INTO audit_events (idempotency_key, terminal_id, terminal_sequence, occurred_at,
                                                  person, action, result)
                        VALUES ((op ->> 'key')::uuid, p_terminal, (op ->> 'sequence')::bigint,
                                (op ->> 'occurred_at')::timestamptz, op ->> 'person', op ->> 'action',
                                op ->> 'result')
                        ON CONFLICT (idempotency_key) DO NOTHING;
                    ELSE
                        RAISE EXCEPTION 'unknown fleet operation %', op ->> 'op';
                    END CASE;
                END LOOP;
                RETURN true;
            END
            $$
            """,
        ])
}
