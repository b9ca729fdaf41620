-- Roles are cluster-wide, so they may exist from another database's install.
-- Creating them needs CREATEROLE (rds_superuser and the owners of most managed
-- services have it); without it an administrator creates them first and the
-- install only grants what is missing.
DO $roles$
DECLARE
    r       text;
    missing text[];
BEGIN
    FOREACH r IN ARRAY ARRAY['relay_publisher', 'relay_consumer', 'relay_admin', 'relay_monitor'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            missing := missing || r;
        END IF;
    END LOOP;
    IF missing IS NOT NULL THEN
        IF NOT (SELECT rolcreaterole OR rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
            RAISE EXCEPTION 'roles % do not exist and % may not create them', missing, current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Have a role with CREATEROLE create them (CREATE ROLE relay_publisher NOLOGIN; ...), then install again.';
        END IF;
        FOREACH r IN ARRAY missing LOOP
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
        END LOOP;
    END IF;
    FOREACH r IN ARRAY ARRAY['relay_publisher', 'relay_consumer', 'relay_monitor'] LOOP
        IF NOT pg_catalog.pg_has_role('relay_admin', r, 'MEMBER') THEN
            EXECUTE pg_catalog.format('GRANT %I TO relay_admin', r);
        END IF;
    END LOOP;
END
$roles$;
