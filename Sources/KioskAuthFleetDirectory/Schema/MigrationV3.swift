extension FleetMigration {
    /// Removal rotates the data key (docs/fleet.md §3, §9.8). Removing a terminal that held the
    /// data key marks the fleet as owing a new generation (`terminals.rekey_due`); a member
    /// publishes it (`fleet_rotate_data_key`, one generation above the newest, serialised against
    /// admissions and other rotations), which clears the mark. Admission now wraps every
    /// generation to the new member (`fleet_admit_keys`, refused unless the wraps cover exactly
    /// the generations there are), so a terminal joining after a rotation can still verify and
    /// open the rows written before it. The single-generation `fleet_admit` of version 2 is
    /// kept for daemons not yet upgraded, refused once there is more than one generation.
    /// Rotation and admission take the lock before they check their caller, so a terminal
    /// removed while its call waited can neither publish the generation its own removal owes
    /// nor admit anyone; a removed terminal's unused join tokens expire with it.
    static let v3 = FleetMigration(
        version: 3,
        summary: "removal rotates the data key (rekey_due); admission wraps every generation",
        statements: [
            "ALTER TABLE terminals ADD COLUMN rekey_due boolean NOT NULL DEFAULT false",
            // A directory at version 2 may hold terminals removed after its newest generation
            // (v2 members never rotated): they are owed a rotation.
            """
            UPDATE terminals SET rekey_due = true
            WHERE state = 'removed' AND removed_at > (SELECT max(created_at) FROM data_keys)
            """,
            // As in version 2, plus: unknown terminals are an error (KA404), removing a removed
            // terminal changes nothing, and removing one that held the data key owes a rotation.
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
                -- Its unused join tokens die with it: nobody could admit with them. Before the
                -- terminals row, in fleet_join's order (token, then terminals), so the two never
                -- deadlock.
                UPDATE join_tokens SET expires_at = least(expires_at, now())
                WHERE issued_by = p_terminal AND used_at IS NULL;
                UPDATE terminals SET state = 'removed', removed_at = now(), rekey_due = (state = 'member')
                WHERE terminal_id = p_terminal AND state <> 'removed';
                DELETE FROM wrapped_keys WHERE terminal_id = p_terminal;
            END
            $$
            """,
            // A new generation, exactly one above the newest, wrapped to exactly the current
            // members. SHARE ROW EXCLUSIVE conflicts with itself and with every write to
            // terminals, so two rotations, or a rotation and an admission or removal, run one
            // after the other; the second rotation then finds its generation taken (KA409).
            """
            CREATE OR REPLACE FUNCTION fleet_rotate_data_key(p_generation integer, p_member uuid, p_reason text,
                                                             p_wraps jsonb)
            RETURNS void
            LANGUAGE plpgsql AS $$
            DECLARE
                wrapped_to uuid;
            BEGIN
                -- Lock first, then check the caller: a removal of p_member that commits while
                -- this call waits for the lock must be seen (each statement after the lock
                -- takes a new snapshot). Checked before the lock, a terminal removed meanwhile
                -- could publish the generation its own removal owes, with a key it chose.
                LOCK TABLE terminals IN SHARE ROW EXCLUSIVE MODE;
                PERFORM fleet_check_terminal(p_member, true);
                IF p_generation IS DISTINCT FROM (SELECT COALESCE(max(generation), 0) + 1 FROM data_keys) THEN
                    RAISE EXCEPTION 'generation % is not the next one', p_generation USING ERRCODE = 'KA409';
                END IF;
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
                UPDATE terminals SET rekey_due = false WHERE rekey_due;
            END
            $$
            """,
            // The issuing member admits the pending terminal that used its token, provided its
            // public key is still the one whose proof the member checked, with every generation
            // wrapped to it (`p_wraps`: generation → {encapsulated, ciphertext} in base64).
            """
            CREATE FUNCTION fleet_admit_keys(p_terminal uuid, p_token uuid, p_public_key bytea, p_wraps jsonb)
            RETURNS uuid
            LANGUAGE plpgsql AS $$
            DECLARE
                admitter uuid;
                wrapped_generation integer;
            BEGIN
                -- Lock first, then find the admitter: one removed while this call waited for
                -- the lock admits nobody.
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
                UPDATE terminals SET state = 'member'
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
            // Version 2's single-generation admission stays for daemons not yet upgraded, but
            // only while the fleet has one generation (then one is every generation): with
            // more it is refused (KA409), which such a daemon logs and skips, so it never makes
            // a member without the older generations.
            """
            CREATE OR REPLACE FUNCTION fleet_admit(p_terminal uuid, p_token uuid, p_public_key bytea,
                                                   p_generation integer, p_encapsulated bytea, p_ciphertext bytea)
            RETURNS uuid
            LANGUAGE plpgsql AS $$
            BEGIN
                IF (SELECT count(*) FROM data_keys) <> 1 THEN
                    RAISE EXCEPTION 'the fleet has several data-key generations: admit with every one (fleet_admit_keys)'
                        USING ERRCODE = 'KA409';
                END IF;
                RETURN fleet_admit_keys(p_terminal, p_token, p_public_key,
                    jsonb_build_object(p_generation::text, jsonb_build_object(
                        'encapsulated', encode(p_encapsulated, 'base64'),
                        'ciphertext', encode(p_ciphertext, 'base64'))));
            END
            $$
            """,
            // CREATE OR REPLACE resets SECURITY DEFINER and SET: give all three back, as in
            // version 2, and take the new function away from PUBLIC first.
            """
            DO $$
            DECLARE
                f text;
            BEGIN
                FOREACH f IN ARRAY ARRAY[
                    'fleet_admit(uuid, uuid, bytea, integer, bytea, bytea)',
                    'fleet_remove_terminal(uuid)',
                    'fleet_rotate_data_key(integer, uuid, text, jsonb)',
                    'fleet_admit_keys(uuid, uuid, bytea, jsonb)'
                ] LOOP
                    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
                    EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp',
                                   f, current_schema());
                    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO kioskauth_terminal', f);
                END LOOP;
            END
            $$
            """,
        ])
}
