-- dbq's role helper, installed once per database by a DBA (a superuser), so that the operator
-- makes and drops the roles of its queues without holding CREATEROLE itself.
--
-- Why: on PostgreSQL 15 and earlier a CREATEROLE role may grant itself any role that is not a
-- superuser, predefined roles included (pg_execute_server_program is a shell through
-- COPY ... PROGRAM). Here CREATEROLE belongs to `dbq_access`, a NOLOGIN role nobody is a member
-- of; the operator may only call these functions, and they act only on names of dbq's shapes
-- (`dbq.names.role_name`): owner roles dbq_o_*, group roles dbq_r_*_<right>, logins dbq_u_*.
-- A group role is granted only to a dbq login; an owner role only to the caller.
--
-- `dbq access install-sql --operator ROLE` prints this file for a role, quoted in place of the
-- placeholder below. Statements are separated by `--;;` lines. Idempotent: run it again after an
-- upgrade of dbq.
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dbq_access') THEN
    CREATE ROLE dbq_access NOLOGIN CREATEROLE;
  END IF;
END $$
--;;
-- Ends the sessions of a login being dropped (QueueUser deleted).
GRANT pg_signal_backend TO dbq_access
--;;
CREATE SCHEMA IF NOT EXISTS dbq_access AUTHORIZATION dbq_access
--;;
REVOKE ALL ON SCHEMA dbq_access FROM PUBLIC
--;;
GRANT USAGE ON SCHEMA dbq_access TO {operator}
--;;
-- Functions are created as dbq_access, so they run as it (SECURITY DEFINER).
SET ROLE dbq_access
--;;
ALTER DEFAULT PRIVILEGES FOR ROLE dbq_access REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC
--;;
CREATE OR REPLACE FUNCTION dbq_access.checked(p_role text, p_kind text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  -- p_role if it is a name of kind p_kind (owner, group, login), else an error naming it.
  IF p_role IS NULL OR length(p_role) > 63 OR NOT p_role ~ (CASE p_kind
      WHEN 'owner' THEN '^dbq_o_[a-z0-9_]+$'
      WHEN 'group' THEN '^dbq_r_[a-z0-9_]+_(send|receive|peek|monitor|publish|manage)$'
      WHEN 'login' THEN '^dbq_u_[a-z0-9_]+$' END) THEN
    RAISE EXCEPTION 'dbq_access: % is not a dbq % role name', p_role, p_kind USING ERRCODE = '42501';
  END IF;
  RETURN p_role;
END $fn$
--;;
CREATE OR REPLACE FUNCTION dbq_access.refuse(p_role text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  RAISE EXCEPTION 'dbq_access: role % exists with attributes dbq does not give: a DBA looks at it', p_role
    USING ERRCODE = '42501';
END $fn$
--;;
CREATE OR REPLACE FUNCTION dbq_access.plain(p_role text, p_login boolean) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  -- Whether role p_role exists (false: it does not) as dbq makes it: no attribute but LOGIN
  -- (p_login; NULL: either) and INHERIT; an error if a role of that name has any other.
  SELECT CASE WHEN r.oid IS NULL THEN false
    WHEN r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls
      OR r.rolcanlogin <> coalesce(p_login, r.rolcanlogin) THEN (SELECT dbq_access.refuse(p_role))
    ELSE true END
  FROM (SELECT 1) one LEFT JOIN pg_roles r ON r.rolname = p_role
$fn$
--;;
CREATE OR REPLACE FUNCTION dbq_access.ensure_owner(p_role text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  -- The owner role of a queue schema, made a role of the caller (the operator), which then
  -- creates objects it owns and grants on them.
  IF NOT dbq_access.plain(dbq_access.checked(p_role, 'owner'), false) THEN
    EXECUTE format('CREATE ROLE %I NOLOGIN', p_role);
  END IF;
  IF NOT pg_has_role(session_user, p_role, 'MEMBER') THEN
    EXECUTE format('GRANT %I TO %I', p_role, session_user);
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION dbq_access.ensure_group(p_role text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF NOT dbq_access.plain(dbq_access.checked(p_role, 'group'), false) THEN
    EXECUTE format('CREATE ROLE %I NOLOGIN', p_role);
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION dbq_access.drop_group(p_role text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  -- A queue's group role, once the queue's routines (and the grants on them) are gone.
  IF dbq_access.plain(dbq_access.checked(p_role, 'group'), false) THEN
    EXECUTE format('DROP ROLE %I', p_role);
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION dbq_access.drop_owner(p_role text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  -- A schema's owner role, once the schema is gone (an error while it still owns anything).
  IF dbq_access.plain(dbq_access.checked(p_role, 'owner'), false) THEN
    EXECUTE format('DROP ROLE %I', p_role);
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION dbq_access.set_login(p_role text, p_verifier text, p_limit int) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  -- A QueueUser's login with this password and connection limit (p_verifier NULL: the password
  -- it has). The password comes as a SCRAM-SHA-256 verifier, never in clear: what reaches the
  -- server's log cannot log anyone in.
  IF NOT p_verifier ~ '^SCRAM-SHA-256\$[0-9]+:[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+$' THEN
    RAISE EXCEPTION 'dbq_access: a password is given as a SCRAM-SHA-256 verifier' USING ERRCODE = '22023';
  END IF;
  IF p_limit IS NULL OR p_limit < 1 THEN
    RAISE EXCEPTION 'dbq_access: a connection limit is a whole number >= 1, not %', p_limit USING ERRCODE = '22023';
  END IF;
  IF dbq_access.plain(dbq_access.checked(p_role, 'login'), true) THEN
    IF p_verifier IS NOT NULL THEN
      EXECUTE format('ALTER ROLE %I PASSWORD %L', p_role, p_verifier);
    END IF;
    EXECUTE format('ALTER ROLE %I CONNECTION LIMIT %s', p_role, p_limit);
  ELSIF p_verifier IS NULL THEN
    RAISE EXCEPTION 'dbq_access: login % does not exist: give its password', p_role USING ERRCODE = '22023';
  ELSE
    EXECUTE format('CREATE ROLE %I LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS'
      ' PASSWORD %L CONNECTION LIMIT %s', p_role, p_verifier, p_limit);
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION dbq_access.grant_group(p_login text, p_group text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF NOT dbq_access.plain(dbq_access.checked(p_login, 'login'), true)
      OR NOT dbq_access.plain(dbq_access.checked(p_group, 'group'), false) THEN
    RAISE EXCEPTION 'dbq_access: % or % does not exist', p_login, p_group USING ERRCODE = '42704';
  END IF;
  IF NOT pg_has_role(p_login, p_group, 'MEMBER') THEN
    EXECUTE format('GRANT %I TO %I', p_group, p_login);
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION dbq_access.revoke_group(p_login text, p_group text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF dbq_access.plain(dbq_access.checked(p_login, 'login'), true)
      AND dbq_access.plain(dbq_access.checked(p_group, 'group'), false) THEN
    EXECUTE format('REVOKE %I FROM %I', p_group, p_login);
  END IF;
END $fn$
--;;
CREATE OR REPLACE FUNCTION dbq_access.drop_login(p_role text) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_ended int;
BEGIN
  -- A QueueUser's login, its open sessions ended first (how many is the answer). Logins own
  -- nothing and hold no grant of their own (only memberships), so nothing is left behind.
  IF NOT dbq_access.plain(dbq_access.checked(p_role, 'login'), NULL) THEN
    RETURN 0;
  END IF;
  EXECUTE format('ALTER ROLE %I NOLOGIN', p_role);  -- no new session from now on
  SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) INTO v_ended
  FROM pg_stat_activity WHERE usename = p_role;
  EXECUTE format('DROP ROLE %I', p_role);
  RETURN v_ended;
END $fn$
--;;
RESET ROLE
--;;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA dbq_access FROM PUBLIC
--;;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA dbq_access TO {operator}
