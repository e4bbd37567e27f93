extension FleetMigration {
    /// Least privilege and row MACs (docs/fleet.md §2, §3, §8): terminals log in as their own
    /// roles, members of `kioskauth_terminal`, which may only SELECT what a pull needs and
    /// EXECUTE the functions above; every write goes through those functions, which refuse a
    /// terminal id that is not `session_user`'s. People, verifier and template rows carry a
    /// version and an HMAC by the writing member; the directory keeps the newest version.
    static let v2 = FleetMigration(
        version: 2,
        summary: "per-terminal roles (kioskauth_terminal), SECURITY DEFINER writes, row-level security, row MACs",
        statements: [
            // Roles are cluster-wide: a second fleet database in the same cluster shares it.
            """
            DO $$
            BEGIN
                IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'kioskauth_terminal') THEN
                    CREATE ROLE kioskauth_terminal NOLOGIN;
                END IF;
            END
            $$
            """,
            // The role a terminal logs in as, recorded when it joins (session_user). One live
            // terminal per role, so "the terminal of this session" is well defined.
            "ALTER TABLE terminals ADD COLUMN db_role text",
            "CREATE UNIQUE INDEX terminals_live_role ON terminals (db_role) WHERE state <> 'removed'",
            // Row MACs: `generation` is the data key whose MAC subkey made `mac`; `version` is
            // the writer's, inside the MAC, so an older row replayed is recognised.
            """
            ALTER TABLE people ADD COLUMN generation integer REFERENCES data_keys,
                ADD COLUMN version bigint NOT NULL DEFAULT 0, ADD COLUMN mac bytea
            """,
            "ALTER TABLE passcode_verifiers ADD COLUMN version bigint NOT NULL DEFAULT 0, ADD COLUMN mac bytea",
            "ALTER TABLE templates ADD COLUMN version bigint NOT NULL DEFAULT 0, ADD COLUMN mac bytea",

            // The terminal `p_terminal` acts for must be session_user's (else 42501), and a
            // member when `p_member` (else KA001).
            """
            CREATE FUNCTION fleet_check_terminal(p_terminal uuid, p_member boolean) RETURNS void
            LANGUAGE plpgsql AS $$
            DECLARE
                found_role text;
                found_state text;
            BEGIN
                SELECT db_role, state INTO found_role, found_state FROM terminals WHERE terminal_id = p_terminal;
                IF NOT FOUND OR found_role IS DISTINCT FROM session_user THEN
                    RAISE EXCEPTION 'terminal % does not belong to role %', p_terminal, session_user
                        USING ERRCODE = 'insufficient_privilege';
                END IF;
                IF p_member AND found_state <> 'member' THEN
                    RAISE EXCEPTION 'terminal % is not a fleet member', p_terminal USING ERRCODE = 'KA001';
                END IF;
            END
            $$
            """,
            // The member terminal of this session (for calls that do not name one).
            """
            CREATE FUNCTION fleet_session_member() RETURNS uuid
            LANGUAGE plpgsql AS $$
            DECLARE
                found_id uuid;
            BEGIN
                SELECT terminal_id INTO found_id FROM terminals WHERE db_role = session_user AND state = 'member';
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'role % has no member terminal', session_user USING ERRCODE = 'KA001';
                END IF;
                RETURN found_id;
            END
            $$
            """,
            """
            CREATE OR REPLACE FUNCTION fleet_apply_push(p_key uuid, p_terminal uuid, p_ops jsonb) RETURNS boolean
            LANGUAGE plpgsql AS $$
            DECLARE
                op jsonb;
            BEGIN
                PERFORM fleet_check_terminal(p_terminal, true);
                INSERT INTO applied_pushes (idempotency_key, terminal_id, operations)
                VALUES (p_key, p_terminal, jsonb_array_length(p_ops))
                ON CONFLICT (idempotency_key) DO NOTHING;
                IF NOT FOUND THEN
                    RETURN false;
                END IF;
                FOR op IN SELECT value FROM jsonb_array_elements(p_ops) LOOP
                    IF op ->> 'op' IN ('person', 'verifier', 'template')
                        AND (op ->> 'mac' IS NULL OR op ->> 'version' IS NULL OR op ->> 'generation' IS NULL) THEN
                        RAISE EXCEPTION 'fleet operation % carries no row MAC', op ->> 'op' USING ERRCODE = 'KA409';
                    END IF;
                    CASE op ->> 'op'
                    WHEN 'person' THEN
                        INSERT INTO people (person_id, name, role, uid, state, updated_by, generation, version, mac)
                        VALUES ((op ->> 'person')::uuid, op ->> 'name', op ->> 'role', (op ->> 'uid')::integer,
                                op ->> 'state', p_terminal, (op ->> 'generation')::integer,
                                (op ->> 'version')::bigint, decode(op ->> 'mac', 'base64'))
                        ON CONFLICT (person_id) DO UPDATE SET name = EXCLUDED.name, role = EXCLUDED.role,
                            uid = EXCLUDED.uid, state = EXCLUDED.state, updated_at = now(), updated_by = p_terminal,
                            generation = EXCLUDED.generation, version = EXCLUDED.version, mac = EXCLUDED.mac
                        WHERE people.version < EXCLUDED.version;
                        IF NOT FOUND THEN
                            -- Older than the row: republish the newer row, so the stale writer's
                            -- next pull brings its copy up to date.
                            UPDATE people SET version = version WHERE person_id = (op ->> 'person')::uuid;
                        END IF;
                    WHEN 'verifier' THEN
                        INSERT INTO passcode_verifiers (person_id, generation, sealed, updated_by, version, mac)
                        VALUES ((op ->> 'person')::uuid, (op ->> 'generation')::integer,
                                decode(op ->> 'sealed', 'base64'), p_terminal, (op ->> 'version')::bigint,
                                decode(op ->> 'mac', 'base64'))
                        ON CONFLICT (person_id) DO UPDATE SET generation = EXCLUDED.generation,
                            sealed = EXCLUDED.sealed, updated_at = now(), updated_by = p_terminal,
                            version = EXCLUDED.version, mac = EXCLUDED.mac
                        WHERE passcode_verifiers.version < EXCLUDED.version;
                        IF NOT FOUND THEN
                            UPDATE passcode_verifiers SET version = version
                            WHERE person_id = (op ->> 'person')::uuid;
                        END IF;
                    WHEN 'template' THEN
                        INSERT INTO templates (template_id, person_id, finger, driver, device_type, generation,
                                               sealed, enrolled_by, version, mac)
                        VALUES ((op ->> 'template')::uuid, (op ->> 'person')::uuid, op ->> 'finger',
                                op ->> 'driver', op ->> 'device_type', (op ->> 'generation')::integer,
                                decode(op ->> 'sealed', 'base64'), p_terminal, (op ->> 'version')::bigint,
                                decode(op ->> 'mac', 'base64'))
                        ON CONFLICT (template_id) DO UPDATE SET person_id = EXCLUDED.person_id,
                            finger = EXCLUDED.finger, driver = EXCLUDED.driver, device_type = EXCLUDED.device_type,
                            generation = EXCLUDED.generation, sealed = EXCLUDED.sealed,
                            enrolled_at = now(), enrolled_by = p_terminal, version = EXCLUDED.version,
                            mac = EXCLUDED.mac
                        WHERE templates.version < EXCLUDED.version;
                        IF NOT FOUND THEN
                            UPDATE templates SET version = version WHERE template_id = (op ->> 'template')::uuid;
                        END IF;
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
            """
            CREATE FUNCTION fleet_record_cursor(p_terminal uuid, p_cursor bigint) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM fleet_check_terminal(p_terminal, false);
                INSERT INTO terminal_sync (terminal_id, cursor) VALUES (p_terminal, p_cursor)
                ON CONFLICT (terminal_id) DO UPDATE SET cursor = EXCLUDED.cursor, last_seen_at = now();
            END
            $$
            """,
            """
            CREATE FUNCTION fleet_issue_join_token(p_token uuid, p_hash bytea, p_issuer uuid, p_seconds double precision)
            RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM fleet_check_terminal(p_issuer, true);
                INSERT INTO join_tokens (token_id, secret_hash, issued_by, expires_at)
                VALUES (p_token, p_hash, p_issuer, now() + make_interval(secs => p_seconds));
            END
            $$
            """,
            // Consumes the token (single use, unexpired) and registers the terminal as pending,
            // owned by session_user. False when the token is unknown, used or expired.
            """
            CREATE FUNCTION fleet_join(p_token uuid, p_hash bytea, p_terminal uuid, p_name text, p_public_key bytea,
                                       p_driver text, p_device_type text, p_match_on_chip boolean, p_proof bytea)
            RETURNS boolean
            LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM terminals WHERE db_role = session_user AND state <> 'removed') THEN
                    RAISE EXCEPTION 'role % already has a terminal in the fleet', session_user USING ERRCODE = 'KA409';
                END IF;
                UPDATE join_tokens SET used_at = now(), used_by = p_terminal
                WHERE token_id = p_token AND secret_hash = p_hash AND used_at IS NULL AND expires_at > now();
                IF NOT FOUND THEN
                    RETURN false;
                END IF;
                INSERT INTO terminals (terminal_id, name, public_key, reader_driver, reader_device_type, match_on_chip,
                                       state, join_token_id, join_proof, db_role)
                VALUES (p_terminal, p_name, p_public_key, p_driver, p_device_type, p_match_on_chip, 'pending',
                        p_token, p_proof, session_user);
                RETURN true;
            END
            $$
            """,
            // The first member, owned by session_user, with generation 1 wrapped to it. False
            // once the fleet has a member.
            """
            CREATE FUNCTION fleet_bootstrap(p_terminal uuid, p_name text, p_public_key bytea, p_driver text,
                                            p_device_type text, p_match_on_chip boolean, p_encapsulated bytea,
                                            p_ciphertext bytea)
            RETURNS boolean
            LANGUAGE plpgsql AS $$
            BEGIN
                LOCK TABLE terminals IN EXCLUSIVE MODE;
                IF EXISTS (SELECT 1 FROM terminals WHERE state = 'member') THEN
                    RETURN false;
                END IF;
                INSERT INTO terminals (terminal_id, name, public_key, reader_driver, reader_device_type, match_on_chip,
                                       state, db_role)
                VALUES (p_terminal, p_name, p_public_key, p_driver, p_device_type, p_match_on_chip, 'member',
                        session_user);
                INSERT INTO data_keys (generation, created_by, reason) VALUES (1, p_terminal, 'fleet created');
                INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext)
                VALUES (p_terminal, 1, p_encapsulated, p_ciphertext);
                RETURN true;
            END
            $$
            """,
            // The issuing member (session_user's) admits the pending terminal that used its
            // token, provided its public key is still the one whose proof the member checked.
            """
            CREATE FUNCTION fleet_admit(p_terminal uuid, p_token uuid, p_public_key bytea, p_generation integer,
                                        p_encapsulated bytea, p_ciphertext bytea)
            RETURNS uuid
            LANGUAGE plpgsql AS $$
            DECLARE
                admitter uuid := fleet_session_member();
            BEGIN
                IF NOT EXISTS (SELECT 1 FROM join_tokens WHERE token_id = p_token AND issued_by = admitter) THEN
                    RAISE EXCEPTION 'join token % was not issued by terminal %', p_token, admitter
                        USING ERRCODE = 'insufficient_privilege';
                END IF;
                UPDATE terminals SET state = 'member'
                WHERE terminal_id = p_terminal AND join_token_id = p_token AND state = 'pending'
                  AND public_key = p_public_key;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'terminal % is no longer pending with the key that was checked', p_terminal
                        USING ERRCODE = 'KA409';
                END IF;
                INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext)
                VALUES (p_terminal, p_generation, p_encapsulated, p_ciphertext);
                RETURN admitter;
            END
            $$
            """,
            // A member removes any terminal; a terminal may remove itself (leaving).
            """
            CREATE FUNCTION fleet_remove_terminal(p_terminal uuid) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                IF NOT EXISTS (SELECT 1 FROM terminals WHERE terminal_id = p_terminal AND db_role = session_user) THEN
                    PERFORM fleet_session_member();
                END IF;
                UPDATE terminals SET state = 'removed', removed_at = now() WHERE terminal_id = p_terminal;
                DELETE FROM wrapped_keys WHERE terminal_id = p_terminal;
            END
            $$
            """,
            // A new generation wrapped to exactly the current members (`p_wraps`: terminal id →
            // {encapsulated, ciphertext} in base64); refused if the members changed meanwhile.
            """
            CREATE FUNCTION fleet_rotate_data_key(p_generation integer, p_member uuid, p_reason text, p_wraps jsonb)
            RETURNS void
            LANGUAGE plpgsql AS $$
            DECLARE
                wrapped_to uuid;
            BEGIN
                PERFORM fleet_check_terminal(p_member, true);
                LOCK TABLE terminals IN SHARE MODE;
                IF (SELECT array_agg(terminal_id::text ORDER BY terminal_id::text) FROM terminals WHERE state = 'member')
                    IS DISTINCT FROM (SELECT array_agg(key ORDER BY key) FROM jsonb_object_keys(p_wraps) AS key) THEN
                    RAISE EXCEPTION 'the fleet''s members changed; wrap the key again' USING ERRCODE = 'KA409';
                END IF;
                INSERT INTO data_keys (generation, created_by, reason) VALUES (p_generation, p_member, p_reason);
                FOR wrapped_to IN SELECT terminal_id FROM terminals WHERE state = 'member' LOOP
                    INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext)
                    VALUES (wrapped_to, p_generation,
                            decode(p_wraps -> wrapped_to::text ->> 'encapsulated', 'base64'),
                            decode(p_wraps -> wrapped_to::text ->> 'ciphertext', 'base64'));
                END LOOP;
            END
            $$
            """,
            // An owner-only helper: a login role for one terminal, member of kioskauth_terminal.
            // Runs with the caller's rights, so it needs CREATEROLE (docs/fleet.md §6).
            """
            CREATE FUNCTION fleet_create_terminal_role(p_role text, p_password text) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                EXECUTE format('CREATE ROLE %I LOGIN IN ROLE kioskauth_terminal', p_role);
                IF p_password IS NOT NULL THEN
                    EXECUTE format('ALTER ROLE %I PASSWORD %L', p_role, p_password);
                END IF;
            END
            $$
            """,

            // Privileges. Functions are executable by PUBLIC by default: take that away from
            // every fleet function, then give terminals exactly the ones above.
            """
            DO $$
            DECLARE
                f regprocedure;
            BEGIN
                FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                         WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'fleet\\_%' LOOP
                    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
                END LOOP;
                EXECUTE format('GRANT USAGE ON SCHEMA %I TO kioskauth_terminal', current_schema());
            END
            $$
            """,
            """
            DO $$
            DECLARE
                f text;
            BEGIN
                -- The functions a terminal role may call. Each is SECURITY DEFINER with the
                -- schema's search path pinned (pg_temp last, so a terminal's temporary tables
                -- never shadow the directory's), and checks that the terminal it acts for
                -- belongs to session_user.
                FOREACH f IN ARRAY ARRAY[
                    'fleet_apply_push(uuid, uuid, jsonb)',
                    'fleet_record_cursor(uuid, bigint)',
                    'fleet_issue_join_token(uuid, bytea, uuid, double precision)',
                    'fleet_join(uuid, bytea, uuid, text, bytea, text, text, boolean, bytea)',
                    'fleet_bootstrap(uuid, text, bytea, text, text, boolean, bytea, bytea)',
                    'fleet_admit(uuid, uuid, bytea, integer, bytea, bytea)',
                    'fleet_remove_terminal(uuid)',
                    'fleet_rotate_data_key(integer, uuid, text, jsonb)'
                ] LOOP
                    EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp',
                                   f, current_schema());
                    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO kioskauth_terminal', f);
                END LOOP;
            END
            $$
            """,
            // What a pull, `fleet status` and the budget read. Not join_tokens (secret hashes)
            // nor applied_pushes; no INSERT, UPDATE or DELETE anywhere.
            """
            GRANT SELECT ON fleet_schema, change_clock, changes, terminals, data_keys, wrapped_keys, people,
                passcode_verifiers, templates, passcode_failures, person_lockout, terminal_sync, audit_events
            TO kioskauth_terminal
            """,
            // Row-level security on per-terminal rows: a terminal reads its own. The owner and
            // superusers bypass it, and so do the SECURITY DEFINER functions (owned by the owner).
            "ALTER TABLE terminal_sync ENABLE ROW LEVEL SECURITY",
            "ALTER TABLE wrapped_keys ENABLE ROW LEVEL SECURITY",
            "ALTER TABLE audit_events ENABLE ROW LEVEL SECURITY",
            """
            CREATE POLICY terminal_sync_own ON terminal_sync FOR SELECT TO kioskauth_terminal
            USING (terminal_id IN (SELECT terminal_id FROM terminals WHERE db_role = session_user))
            """,
            """
            CREATE POLICY wrapped_keys_own ON wrapped_keys FOR SELECT TO kioskauth_terminal
            USING (terminal_id IN (SELECT terminal_id FROM terminals WHERE db_role = session_user))
            """,
            """
            CREATE POLICY audit_events_own ON audit_events FOR SELECT TO kioskauth_terminal
            USING (terminal_id IN (SELECT terminal_id FROM terminals WHERE db_role = session_user))
            """,
        ])
}
