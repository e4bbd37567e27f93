extension FleetMigration {
    /// Keys and members are authenticated by members, not taken on the directory's word
    /// (docs/fleet.md §6.2, `FleetKeyAuthentication`). Each new generation carries a MAC under
    /// the generation before it (`data_keys.chain_mac`); an admission carries a MAC of every
    /// generation wrapped to the newcomer under the join secret (`terminals.admission_mac`,
    /// `admitted_through`); every member row carries a vouch, a MAC of its id and public key
    /// under a data key (`vouch_generation`, `vouch_mac`), and a rotation is wrapped only to the
    /// members whose vouch opens (the others are named in `p_unvouched`, so the directory can
    /// still check that no member was forgotten). A member whose row predates this migration
    /// vouches for itself (`fleet_vouch`). The directory cannot check any of these MACs (it holds
    /// no key); it only stores them. The earlier signatures of the functions that make keys or
    /// members now refuse, naming the upgrade: a daemon from before this migration would make
    /// generations and members nobody can authenticate.
    static let v4 = FleetMigration(
        version: 4,
        summary: "generations, admissions and members carry MACs under keys the directory does not hold",
        statements: [
            "ALTER TABLE data_keys ADD COLUMN chain_mac bytea",
            """
            ALTER TABLE terminals ADD COLUMN admission_mac bytea, ADD COLUMN admitted_through integer,
                ADD COLUMN vouch_generation integer, ADD COLUMN vouch_mac bytea
            """,
            // As version 2's, plus the creator's vouch for itself under generation 1.
            """
            CREATE FUNCTION fleet_bootstrap(p_terminal uuid, p_name text, p_public_key bytea, p_driver text,
                                            p_device_type text, p_match_on_chip boolean, p_encapsulated bytea,
                                            p_ciphertext bytea, p_vouch_mac bytea)
            RETURNS boolean
            LANGUAGE plpgsql AS $$
            BEGIN
                IF octet_length(p_vouch_mac) IS DISTINCT FROM 32 THEN
                    RAISE EXCEPTION 'the creator''s vouch must be 32 bytes' USING ERRCODE = 'KA409';
                END IF;
                LOCK TABLE terminals IN EXCLUSIVE MODE;
                IF EXISTS (SELECT 1 FROM terminals WHERE state = 'member') THEN
                    RETURN false;
                END IF;
                INSERT INTO terminals (terminal_id, name, public_key, reader_driver, reader_device_type, match_on_chip,
                                       state, db_role, vouch_generation, vouch_mac)
                VALUES (p_terminal, p_name, p_public_key, p_driver, p_device_type, p_match_on_chip, 'member',
                        session_user, 1, p_vouch_mac);
                INSERT INTO data_keys (generation, created_by, reason) VALUES (1, p_terminal, 'fleet created');
                INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext)
                VALUES (p_terminal, 1, p_encapsulated, p_ciphertext);
                RETURN true;
            END
            $$
            """,
            // As version 3's fleet_admit_keys, plus the admission MAC (over generations
            // 1 … newest, which the wraps must cover) and the admitting member's vouch.
            """
            CREATE FUNCTION fleet_admit_keys(p_terminal uuid, p_token uuid, p_public_key bytea, p_wraps jsonb,
                                             p_admission_mac bytea, p_vouch_generation integer, p_vouch_mac bytea)
            RETURNS uuid
            LANGUAGE plpgsql AS $$
            DECLARE
                admitter uuid;
                wrapped_generation integer;
            BEGIN
                IF octet_length(p_admission_mac) IS DISTINCT FROM 32 OR octet_length(p_vouch_mac) IS DISTINCT FROM 32 THEN
                    RAISE EXCEPTION 'an admission carries a 32-byte admission MAC and vouch' USING ERRCODE = 'KA409';
                END IF;
                LOCK TABLE terminals IN SHARE ROW EXCLUSIVE MODE;
                admitter := fleet_session_member();
                IF NOT EXISTS (SELECT 1 FROM join_tokens WHERE token_id = p_token AND issued_by = admitter) THEN
                    RAISE EXCEPTION 'join token % was not issued by terminal %', p_token, admitter
                        USING ERRCODE = 'insufficient_privilege';
                END IF;
                IF (SELECT array_agg(generation::text ORDER BY generation::text) FROM data_keys)
                    IS DISTINCT FROM (SELECT array_agg(key ORDER BY key) FROM jsonb_object_keys(p_wraps) AS key) THEN
                    RAISE EXCEPTION 'the wraps do not cover exactly the fleet''s data-key generations'
                        USING ERRCODE = 'KA409';
                END IF;
                IF NOT EXISTS (SELECT 1 FROM data_keys WHERE generation = p_vouch_generation) THEN
                    RAISE EXCEPTION 'no data-key generation %', p_vouch_generation USING ERRCODE = 'KA409';
                END IF;
                UPDATE terminals SET state = 'member', admission_mac = p_admission_mac,
                       admitted_through = (SELECT max(generation) FROM data_keys),
                       vouch_generation = p_vouch_generation, vouch_mac = p_vouch_mac
                WHERE terminal_id = p_terminal AND join_token_id = p_token AND state = 'pending'
                  AND public_key = p_public_key;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'terminal % is no longer pending with the key that was checked', p_terminal
                        USING ERRCODE = 'KA409';
                END IF;
                FOR wrapped_generation IN SELECT generation FROM data_keys ORDER BY generation LOOP
                    INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext)
                    VALUES (p_terminal, wrapped_generation,
                            decode(p_wraps -> wrapped_generation::text ->> 'encapsulated', 'base64'),
                            decode(p_wraps -> wrapped_generation::text ->> 'ciphertext', 'base64'));
                END LOOP;
                RETURN admitter;
            END
            $$
            """,
            // As version 3's, plus the chain MAC, and wrapped only to the members in p_wraps,
            // each with its vouch under the new generation ({encapsulated, ciphertext, vouch}):
            // every member is either there or named in p_unvouched (a JSON array of ids), never
            // both, so a member admitted meanwhile is not left out unnoticed (KA409).
            """
            CREATE FUNCTION fleet_rotate_data_key(p_generation integer, p_member uuid, p_reason text, p_wraps jsonb,
                                                  p_chain_mac bytea, p_unvouched jsonb)
            RETURNS void
            LANGUAGE plpgsql AS $$
            DECLARE
                wrapped_to uuid;
            BEGIN
                LOCK TABLE terminals IN SHARE ROW EXCLUSIVE MODE;
                PERFORM fleet_check_terminal(p_member, true);
                IF p_generation IS DISTINCT FROM (SELECT COALESCE(max(generation), 0) + 1 FROM data_keys) THEN
                    RAISE EXCEPTION 'generation % is not the next one', p_generation USING ERRCODE = 'KA409';
                END IF;
                IF octet_length(p_chain_mac) IS DISTINCT FROM 32 THEN
                    RAISE EXCEPTION 'a new generation carries a 32-byte MAC under the one before' USING ERRCODE = 'KA409';
                END IF;
                IF (SELECT array_agg(terminal_id::text ORDER BY terminal_id::text) FROM terminals WHERE state = 'member')
                    IS DISTINCT FROM (SELECT array_agg(key ORDER BY key) FROM (
                        SELECT jsonb_object_keys(p_wraps) AS key
                        UNION ALL SELECT jsonb_array_elements_text(p_unvouched)) AS listed) THEN
                    RAISE EXCEPTION 'the fleet''s members changed; wrap the key again' USING ERRCODE = 'KA409';
                END IF;
                IF NOT p_wraps ? p_member::text THEN
                    RAISE EXCEPTION 'a rotation is wrapped to the member that makes it' USING ERRCODE = 'KA409';
                END IF;
                IF EXISTS (SELECT 1 FROM jsonb_each(p_wraps) AS wrap
                           WHERE octet_length(decode(wrap.value ->> 'vouch', 'base64')) IS DISTINCT FROM 32) THEN
                    RAISE EXCEPTION 'each member given the key is vouched for under it' USING ERRCODE = 'KA409';
                END IF;
                INSERT INTO data_keys (generation, created_by, reason, chain_mac)
                VALUES (p_generation, p_member, p_reason, p_chain_mac);
                FOR wrapped_to IN SELECT terminal_id FROM terminals WHERE state = 'member' AND p_wraps ? terminal_id::text
                LOOP
                    INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext)
                    VALUES (wrapped_to, p_generation,
                            decode(p_wraps -> wrapped_to::text ->> 'encapsulated', 'base64'),
                            decode(p_wraps -> wrapped_to::text ->> 'ciphertext', 'base64'));
                END LOOP;
                -- Vouches are renewed under the new generation: one made under an older one
                -- (a removed terminal's, put back by a writer) no longer counts.
                UPDATE terminals SET vouch_generation = p_generation,
                       vouch_mac = decode(p_wraps -> terminal_id::text ->> 'vouch', 'base64')
                WHERE state = 'member' AND p_wraps ? terminal_id::text;
                UPDATE terminals SET rekey_due = false WHERE rekey_due;
            END
            $$
            """,
            // A member vouches for its own row (one from before this migration, or one whose
            // vouch no longer opens).
            """
            CREATE FUNCTION fleet_vouch(p_terminal uuid, p_generation integer, p_mac bytea) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM fleet_check_terminal(p_terminal, true);
                IF octet_length(p_mac) IS DISTINCT FROM 32
                   OR p_generation IS DISTINCT FROM (SELECT max(generation) FROM data_keys) THEN
                    RAISE EXCEPTION 'a vouch is 32 bytes under the newest generation' USING ERRCODE = 'KA409';
                END IF;
                UPDATE terminals SET vouch_generation = p_generation, vouch_mac = p_mac
                WHERE terminal_id = p_terminal AND state = 'member';
            END
            $$
            """,
            // As version 3's, and a removed terminal's vouch goes with its keys: a row set back to
            // `member` by a writer is not vouched for by anyone.
            """
            CREATE OR REPLACE FUNCTION fleet_remove_terminal(p_terminal uuid) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                IF NOT EXISTS (SELECT 1 FROM terminals WHERE terminal_id = p_terminal AND db_role = session_user) THEN
                    PERFORM fleet_session_member();
                END IF;
                IF NOT EXISTS (SELECT 1 FROM terminals WHERE terminal_id = p_terminal) THEN
                    RAISE EXCEPTION 'no terminal %', p_terminal USING ERRCODE = 'KA404';
                END IF;
                UPDATE join_tokens SET expires_at = least(expires_at, now())
                WHERE issued_by = p_terminal AND used_at IS NULL;
                UPDATE terminals SET state = 'removed', removed_at = now(), rekey_due = (state = 'member'),
                       vouch_generation = NULL, vouch_mac = NULL
                WHERE terminal_id = p_terminal AND state <> 'removed';
                DELETE FROM wrapped_keys WHERE terminal_id = p_terminal;
            END
            $$
            """,
            // The signatures older daemons call now refuse, by name (`retired`).
        ] + retired.map(\.statement) + [
            """
            DO $$
            DECLARE
                f text;
            BEGIN
                FOREACH f IN ARRAY ARRAY[
                    'fleet_bootstrap(uuid, text, bytea, text, text, boolean, bytea, bytea, bytea)',
                    'fleet_admit_keys(uuid, uuid, bytea, jsonb, bytea, integer, bytea)',
                    'fleet_rotate_data_key(integer, uuid, text, jsonb, bytea, jsonb)',
                    'fleet_vouch(uuid, integer, bytea)',
                    'fleet_remove_terminal(uuid)',
                    \(retired.map { "'\($0.signature)'" }.joined(separator: ", "))
                ] LOOP
                    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
                    EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp',
                                   f, current_schema());
                    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO kioskauth_terminal', f);
                END LOOP;
            END
            $$
            """
        ])

    /// The signatures daemons from before this migration call, which now refuse with KA426
    /// ("upgrade it") and stay SECURITY DEFINER with a pinned search path, like every function
    /// a terminal may call (the grant loop above): such a daemon would make generations and
    /// members nobody can authenticate.
    static let retired: [(signature: String, statement: String)] = [
        (
            "fleet_bootstrap",
            "p_terminal uuid, p_name text, p_public_key bytea, p_driver text, p_device_type text, "
                + "p_match_on_chip boolean, p_encapsulated bytea, p_ciphertext bytea", "boolean", "create its fleet"
        ),
        ("fleet_admit_keys", "p_terminal uuid, p_token uuid, p_public_key bytea, p_wraps jsonb", "uuid", "admit"),
        (
            "fleet_admit",
            "p_terminal uuid, p_token uuid, p_public_key bytea, p_generation integer, p_encapsulated bytea, "
                + "p_ciphertext bytea", "uuid", "admit"
        ),
        (
            "fleet_rotate_data_key", "p_generation integer, p_member uuid, p_reason text, p_wraps jsonb", "void",
            "rotate the data key"
        ),
    ].map { name, parameters, returns, what in
        // The same parameter names as before (CREATE OR REPLACE may not rename them); the
        // signature, for the grant loop, is the types alone.
        let types = parameters.split(separator: ",").map { $0.split(separator: " ").last.map(String.init) ?? "" }
        return (
            "\(name)(\(types.joined(separator: ", ")))",
            """
            CREATE OR REPLACE FUNCTION \(name)(\(parameters)) RETURNS \(returns)
            LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'the directory is at schema 4: this kioskauthd is too old to \(what), upgrade it'
                    USING ERRCODE = 'KA426';
            END
            $$
            """
        )
    }
}
