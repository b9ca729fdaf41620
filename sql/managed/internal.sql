-- Internal functions (SQL and PL/pgSQL) -------------------------------------------
-- The extension's C functions of the same names, with the same results where a
-- table can give them; what shared memory counts (workers, per-handler
-- counters, latency) is empty here (docs/managed.md).

-- Leases: the extension keeps them in shared memory; here a row per leased
-- delivery. UNLOGGED: like shared memory, a crash forgets them (a restart
-- charges nothing), and taking one writes no WAL. A completion (ack, nack)
-- sets completed_by to its transaction and keeps the row locked: the lease is
-- that transaction's until it ends, as in the extension; once it committed
-- the row is no lease (a claim removes it), and if it aborted the mark is
-- gone with it.
CREATE UNLOGGED TABLE relay.leases (
    delivery_id   bigint PRIMARY KEY,
    handler_id    integer NOT NULL,
    token         uuid NOT NULL,
    lease_until   timestamptz NOT NULL,
    owner_pid     integer NOT NULL,           -- the session that took it (the id-only forms), or
                                              -- 0: an agent's NOTIFY of an ack-mode handler, which
                                              -- relay_claim of that handler takes over
    completed_by  xid8
);

-- Whether a lease row is a lease now (see relay.leases).
CREATE FUNCTION relay._is_lease(completed_by xid8) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT completed_by IS NULL OR completed_by = pg_current_xact_id_if_assigned()
$$;

-- A relaybus setting: the value a session, a role or the database set, else
-- the extension's default. Without the library relaybus.* settings are
-- placeholders (plain text), so the unit the extension's GUC has is applied
-- here: unit 's' and 'ms' take a number or an interval, 'B' a number or a size
-- ('512B', '1kB', '2 MB': as the library shows and reads them).
CREATE FUNCTION relay._setting(name text, unit text, fallback bigint, lo bigint, hi bigint)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    raw text := current_setting('relaybus.' || _setting.name, true);
    v   numeric;
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN _setting.fallback;
    END IF;
    BEGIN
        IF raw ~ '^\s*-?[0-9]+\s*$' THEN
            v := raw::numeric;
        ELSIF unit IN ('s', 'ms') THEN
            v := extract(epoch FROM raw::interval) * CASE unit WHEN 's' THEN 1 ELSE 1000 END;
        ELSIF unit = 'B' THEN
            -- The library shows a byte setting as '512B', which
            -- PostgreSQL 15's pg_size_bytes refuses (it wants '512 bytes').
            v := pg_size_bytes(regexp_replace(raw, '^\s*(-?[0-9]+)\s*B\s*$', '\1'));
        ELSE
            RAISE invalid_text_representation;
        END IF;
    EXCEPTION WHEN data_exception THEN
        RAISE EXCEPTION 'invalid value for parameter "relaybus.%": "%"', _setting.name, raw
            USING ERRCODE = 'invalid_parameter_value';
    END;
    IF v < lo OR v > hi THEN
        RAISE EXCEPTION '% is outside the valid range for parameter "relaybus.%" (% .. %)', raw, _setting.name, lo, hi
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN round(v);
END
$$;

-- core::format_duration_ms: the largest of d, h, min, s, ms that divides exactly.
CREATE FUNCTION relay._format_ms(ms bigint) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE WHEN ms = 0 THEN '0s'
                WHEN ms % 86400000 = 0 THEN (ms / 86400000) || 'd'
                WHEN ms % 3600000 = 0 THEN (ms / 3600000) || 'h'
                WHEN ms % 60000 = 0 THEN (ms / 60000) || 'min'
                WHEN ms % 1000 = 0 THEN (ms / 1000) || 's'
                ELSE ms || 'ms' END
$$;

-- core::parse_duration_ms through PostgreSQL's interval input (which reads
-- the same forms: "250ms", "2 s", "5min", "1h 30min", "00:00:05", "1 day");
-- months, years and negative values are refused as the core refuses them.
-- NULL: not a duration.
CREATE FUNCTION relay._duration_ms(t text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    i interval;
BEGIN
    IF btrim(t) = '' OR EXISTS (
           SELECT 1 FROM regexp_matches(lower(t), '[a-z]+', 'g') AS m(u)
            WHERE m.u[1] NOT IN ('ms', 'msec', 'msecs', 'millisecond', 'milliseconds', 's', 'sec', 'secs',
                                 'second', 'seconds', 'm', 'min', 'mins', 'minute', 'minutes', 'h', 'hr',
                                 'hrs', 'hour', 'hours', 'd', 'day', 'days', 'w', 'week', 'weeks')) THEN
        RETURN NULL;
    END IF;
    i := t::interval;
    IF extract(month FROM i) <> 0 OR extract(year FROM i) <> 0 OR i < interval '0' THEN
        RETURN NULL;
    END IF;
    RETURN round(extract(epoch FROM i) * 1000);
EXCEPTION WHEN data_exception OR syntax_error THEN
    RETURN NULL;
END
$$;

-- core::text::quote: "..." with '"' and '\' escaped, control bytes as '?',
-- cut after 40 bytes (not inside a character) with "...".
CREATE FUNCTION relay._quote(s text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT '"' || regexp_replace(replace(replace(c.head, '\', '\\'), '"', '\"'), '[\x01-\x1f\x7f]', '?', 'g')
           || CASE WHEN octet_length(s) > 40 THEN '...' ELSE '' END || '"'
      FROM (SELECT left(s, (SELECT max(n) FROM generate_series(0, 40) AS n
                             WHERE octet_length(left(s, n)) <= 40)) AS head) c
$$;

-- core::text::describe_char for the first character of c.
CREATE FUNCTION relay._describe_char(c text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE WHEN ascii(c) BETWEEN 33 AND 126 THEN 'character ''' || left(c, 1) || ''''
                WHEN c LIKE ' %' THEN 'a space'
                ELSE 'byte 0x' || upper(lpad(to_hex(get_byte(convert_to(left(c, 1), 'UTF8'), 0)), 2, '0')) END
$$;

-- core::is_valid_topic / is_valid_pattern: NULL if valid, else why not.
CREATE FUNCTION relay._topic_error(s text, wildcards boolean) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    seg text;
    n   integer := 0;
    bad text;
BEGIN
    IF s = '' THEN RETURN 'must not be empty'; END IF;
    IF octet_length(s) > 255 THEN RETURN 'longer than 255 bytes'; END IF;
    FOREACH seg IN ARRAY string_to_array(s, '.') LOOP
        n := n + 1;
        IF seg = '' THEN RETURN 'segment ' || n || ' is empty'; END IF;
        CONTINUE WHEN wildcards AND seg IN ('*', '#');
        bad := substring(seg FROM '[^A-Za-z0-9_-]');
        IF bad IS NOT NULL THEN
            IF wildcards AND bad IN ('*', '#') THEN
                RETURN 'wildcard ''' || bad || ''' must be a whole segment (segment ' || n || ')';
            END IF;
            RETURN relay._describe_char(bad) || ' is not allowed';
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- A topic (pattern: a route pattern, wildcards allowed) or its error.
CREATE FUNCTION relay._check_topic(t text, pattern boolean) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    why text;
BEGIN
    IF t IS NULL THEN
        RAISE EXCEPTION 'topic must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    why := relay._topic_error(t, pattern);
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'invalid topic %"%"', CASE WHEN pattern THEN 'pattern ' ELSE '' END, t
            USING ERRCODE = 'invalid_parameter_value', DETAIL = why,
                  HINT = CASE WHEN pattern THEN 'Use dot-separated segments; ''*'' matches one segment, ''#'' any number.'
                              ELSE 'A topic is dot-separated segments of letters, digits, ''_'' and ''-'', such as order.created.' END;
    END IF;
END
$$;

-- An integer argument between lo and hi (22023 otherwise, NULL included).
CREATE FUNCTION relay._check_between(what text, v integer, lo integer, hi integer, hint text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF v IS NULL OR v NOT BETWEEN lo AND hi THEN
        IF v IS NULL OR hint IS NULL THEN
            RAISE EXCEPTION '% must be between % and %, not %', what, lo, hi, coalesce(v::text, 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RAISE EXCEPTION '% must be between % and %, not %', what, lo, hi, v
            USING ERRCODE = 'invalid_parameter_value', HINT = hint;
    END IF;
END
$$;

-- A route pattern as a regular expression over '.' || topic: '*' one segment,
-- '#' zero or more (core::topic_matches). The dot is written [.]: a session
-- with standard_conforming_strings = off reads '\.' as '.', any character.
CREATE FUNCTION relay._pattern_regex(pattern text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT '^' || string_agg(CASE seg WHEN '*' THEN '[.][^.]+' WHEN '#' THEN '([.][^.]+)*'
                                  ELSE '[.]' || seg END, '' ORDER BY i) || '$'
      FROM unnest(string_to_array(pattern, '.')) WITH ORDINALITY AS t(seg, i)
$$;

-- core::pattern_specificity: 0 for an exact topic, else 1 + '*'s + 100 * '#'s.
-- A wildcard is a whole segment (relay._validate_route), so its characters
-- count its segments; one expression, which the planner inlines. Not STRICT:
-- the planner does not inline a STRICT function whose body (a CASE) is not
-- strict, and then plans the body again at each call.
CREATE FUNCTION relay._pattern_specificity(pattern text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN pattern !~ '[*#]' THEN 0
                ELSE 1 + (length(pattern) - length(replace(pattern, '*', '')))
                       + 100 * (length(pattern) - length(replace(pattern, '#', ''))) END
$$;

-- The handlers an event of topic goes to, with the wire name of the most
-- specific matching route of each (docs/sql-api.md, relay_route).
CREATE FUNCTION relay._routes_for(topic text, OUT handler_id integer, OUT wire_name text,
                                  OUT kind text)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT DISTINCT ON (r.handler_id) r.handler_id, r.wire_name, h.kind
      FROM relay.routes r JOIN relay.handlers h ON h.id = r.handler_id
     WHERE r.pattern = _routes_for.topic
        OR (r.pattern ~ '[*#]' AND '.' || _routes_for.topic ~ relay._pattern_regex(r.pattern))
     ORDER BY r.handler_id, relay._pattern_specificity(r.pattern), r.pattern COLLATE "C"
$$;

-- core::validate_target for an http URL: NULL if valid, else why not.
CREATE FUNCTION relay._url_error(url text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    sep    integer;
    rest   text;
    auth   text;
    host   text;
    port   text;
    path   text;
    bad    text;
BEGIN
    IF octet_length(url) > 2048 THEN RETURN 'URL is longer than 2048 bytes'; END IF;
    IF url ~ '[\x01-\x20\x7f]' THEN RETURN 'URL must not contain whitespace or control characters'; END IF;
    IF url ~ '[^\x01-\x7f]' THEN RETURN 'URL must be ASCII (percent-encode other characters)'; END IF;
    sep := strpos(url, '://');
    IF sep = 0 THEN RETURN 'URL must start with http:// or https://'; END IF;
    IF lower(left(url, sep - 1)) NOT IN ('http', 'https') THEN
        RETURN 'URL scheme must be http or https (got ' || relay._quote(left(url, sep - 1)) || ')';
    END IF;
    IF strpos(url, '#') > 0 THEN RETURN 'URL must not contain a fragment (''#'')'; END IF;
    rest := substr(url, sep + 3);
    auth := substring(rest FROM '^[^/?]*');
    path := substr(rest, length(auth) + 1);
    IF strpos(auth, '@') > 0 THEN RETURN 'URL must not contain user credentials (user:password@)'; END IF;
    IF auth = '' THEN RETURN 'URL has no host'; END IF;
    IF left(auth, 1) = '[' THEN
        IF strpos(auth, ']') = 0 THEN RETURN 'URL has an unterminated IPv6 address (''['' without '']'')'; END IF;
        host := left(auth, strpos(auth, ']'));
        IF NOT relay._is_ipv6(substr(host, 2, length(host) - 2)) THEN
            RETURN 'URL has an invalid IPv6 address ' || relay._quote(host);
        END IF;
        rest := substr(auth, strpos(auth, ']') + 1);
        IF rest <> '' AND left(rest, 1) <> ':' THEN RETURN 'URL has unexpected text after the IPv6 address'; END IF;
        port := nullif(substr(rest, 2), '');
        IF rest = ':' THEN port := ''; END IF;
    ELSE
        host := split_part(auth, ':', 1);
        port := CASE WHEN strpos(auth, ':') > 0 THEN substr(auth, strpos(auth, ':') + 1) END;
        IF host = '' THEN RETURN 'URL has no host'; END IF;
        IF NOT relay._is_host_name(host) THEN
            RETURN 'URL has an invalid host ' || relay._quote(host);
        END IF;
    END IF;
    IF port IS NOT NULL AND (port !~ '^[0-9]{1,5}$' OR port::integer NOT BETWEEN 1 AND 65535) THEN
        RETURN 'URL port must be a number between 1 and 65535 (got ' || relay._quote(port) || ')';
    END IF;
    IF path ~ '%([^0-9A-Fa-f]|.[^0-9A-Fa-f]|.?$)' THEN RETURN 'URL has a ''%'' not followed by two hex digits'; END IF;
    bad := substring(path FROM '["<>\\]');
    IF bad IS NOT NULL THEN
        RETURN relay._describe_char(bad) || ' is not allowed in a URL (percent-encode it)';
    END IF;
    RETURN NULL;
END
$$;

-- core::parse_kafka_target: kafka://host:port[,host:port...]/topic. NULL if
-- valid, else why not.
CREATE FUNCTION relay._kafka_target_error(target text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    rest    text;
    brokers text;
    topic   text;
    b       text;
    port    text;
    n       integer := 0;
BEGIN
    IF octet_length(target) > 2048 THEN RETURN 'target is longer than 2048 bytes'; END IF;
    IF target ~ '[^\x21-\x7e]' THEN RETURN 'target must be ASCII without whitespace or control characters'; END IF;
    IF left(target, 8) <> 'kafka://' THEN RETURN 'target must be kafka://host:port[,host:port...]/topic'; END IF;
    rest := substr(target, 9);
    IF strpos(rest, '/') = 0 THEN RETURN 'a kafka target needs a topic: kafka://host:port/topic'; END IF;
    brokers := left(rest, strpos(rest, '/') - 1);
    topic := substr(rest, strpos(rest, '/') + 1);
    IF brokers = '' THEN RETURN 'a kafka target needs at least one broker: kafka://host:port/topic'; END IF;
    IF strpos(brokers, '@') > 0 THEN
        RETURN 'target must not contain credentials (use the producer option''s sasl.* properties)';
    END IF;
    FOREACH b IN ARRAY string_to_array(brokers, ',') LOOP
        IF b = '' THEN RETURN 'target has an empty broker in its list'; END IF;
        IF left(b, 1) = '[' THEN
            IF b !~ '^\[[^]]*\]:' THEN RETURN 'broker ' || relay._quote(b) || ' must be [IPv6]:port'; END IF;
            IF NOT relay._is_ipv6(substring(b FROM '^\[([^]]*)\]')) THEN
                RETURN 'broker ' || relay._quote(b) || ' has an invalid IPv6 address';
            END IF;
            port := substring(b FROM '^\[[^]]*\]:(.*)$');
        ELSE
            IF strpos(b, ':') = 0 THEN RETURN 'broker ' || relay._quote(b) || ' needs a port (host:port)'; END IF;
            port := substring(b FROM ':([^:]*)$');
            IF NOT relay._is_host_name(left(b, length(b) - length(port) - 1)) THEN
                RETURN 'broker ' || relay._quote(b) || ' has an invalid host';
            END IF;
        END IF;
        IF port !~ '^[0-9]{1,5}$' OR port::integer NOT BETWEEN 1 AND 65535 THEN
            RETURN 'broker ' || relay._quote(b) || ': port must be a number between 1 and 65535';
        END IF;
        n := n + 1;
        IF n > 32 THEN RETURN 'target names more than 32 brokers'; END IF;
    END LOOP;
    IF topic = '' THEN RETURN 'a kafka target needs a topic: kafka://host:port/topic'; END IF;
    IF octet_length(topic) > 249 THEN RETURN 'topic is longer than 249 bytes'; END IF;
    IF topic IN ('.', '..') THEN RETURN 'topic must not be "." or ".."'; END IF;
    IF topic ~ '[^A-Za-z0-9._-]' THEN
        RETURN 'topic ' || relay._quote(topic) || ': ' || relay._describe_char(substring(topic FROM '[^A-Za-z0-9._-]'))
               || ' is not allowed (only A-Z, a-z, 0-9, ''.'', ''_'' and ''-'')';
    END IF;
    RETURN NULL;
END
$$;

-- A host name: dot-separated labels of 1 to 63 letters, digits, '-' or '_',
-- at most 253 bytes in all.
CREATE FUNCTION relay._is_host_name(host text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT octet_length(host) BETWEEN 1 AND 253
       AND host ~ '^[A-Za-z0-9_-]{1,63}(\.[A-Za-z0-9_-]{1,63})*$'
$$;

CREATE FUNCTION relay._is_ipv6(addr text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    RETURN addr ~ '^[0-9A-Fa-f:.]{2,45}$' AND strpos(addr, ':') > 0 AND family(addr::inet) = 6
           AND masklen(addr::inet) = 128;
EXCEPTION WHEN data_exception THEN
    RETURN false;
END
$$;

-- core::validate_kafka_property without librdkafka's own check of the name
-- and value (docs/managed.md): NULL if accepted, else why not.
CREATE FUNCTION relay._kafka_property_error(name text, value text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE
        WHEN octet_length(name) NOT BETWEEN 1 AND 128 THEN 'option "producer": property names are 1 to 128 bytes'
        WHEN name IN ('bootstrap.servers', 'metadata.broker.list', 'enable.idempotence', 'acks',
                      'request.required.acks', 'message.timeout.ms', 'delivery.timeout.ms', 'transactional.id',
                      'transaction.timeout.ms', 'enable.gapless.guarantee', 'max.in.flight.requests.per.connection',
                      'max.in.flight', 'retries', 'message.send.max.retries', 'dr_cb', 'dr_msg_cb', 'error_cb',
                      'log_cb', 'log.queue', 'throttle_cb', 'stats_cb', 'background_event_cb', 'opaque',
                      'default_topic_conf', 'enabled_events', 'client.software.name', 'client.software.version')
            THEN 'option "producer": property ' || relay._quote(name) || ' is set by relaybus'
        WHEN name IN ('plugin.library.paths', 'sasl.kerberos.kinit.cmd', 'ssl.engine.location', 'ssl.engine.id',
                      'ssl.providers', 'oauthbearer_token_refresh_cb', 'ssl_engine_callback_data')
            THEN 'option "producer": property ' || relay._quote(name)
                 || ' is not allowed (it loads code or runs a command in the server)'
        WHEN octet_length(value) > 65536
            THEN 'option "producer": value of ' || relay._quote(name) || ' is too long or contains NUL'
    END
$$;

-- The extension's relay._validate_handler (src/core/handler_config.cpp), with
-- the same messages and SQLSTATEs; test/vectors/handler_options.tsv is the
-- table both are tested against.
CREATE FUNCTION relay._validate_handler(name text, kind text, target text, options jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    why      text;
    opt      record;
    kinds    text[];
    n        numeric;
    ms       bigint;
    base_ms  bigint := 1000;
    max_ms   bigint := 600000;
    secrets  text[];
    s        text;
    key      bytea;
    hdr      record;
    seen     text[] := '{}';
    has_rate  boolean := false;
    has_burst boolean := false;
    i        integer;
    envelope_asked boolean := false;
    cloudevents_on boolean := false;
BEGIN
    IF _validate_handler.name IS NULL THEN
        RAISE EXCEPTION 'name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF _validate_handler.kind IS NULL THEN
        RAISE EXCEPTION 'kind must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    why := CASE WHEN _validate_handler.name = '' THEN 'must not be empty'
                WHEN octet_length(_validate_handler.name) > 63 THEN 'longer than 63 bytes'
                WHEN _validate_handler.name ~ '[^a-z0-9_.-]' THEN
                     relay._describe_char(substring(_validate_handler.name FROM '[^a-z0-9_.-]'))
                     || ' is not allowed (only a-z, 0-9, ''_'', ''.'' and ''-'')' END;
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'invalid handler name "%"', _validate_handler.name
            USING ERRCODE = 'invalid_parameter_value', DETAIL = why,
                  HINT = 'Use 1 to 63 lower-case letters, digits, ''_'', ''.'' or ''-''.';
    END IF;
    IF _validate_handler.kind NOT IN ('notify', 'http', 'pull', 'kafka') THEN
        RAISE EXCEPTION 'invalid handler kind "%"', _validate_handler.kind
            USING ERRCODE = 'invalid_parameter_value', HINT = 'The kinds are notify, http, pull and kafka.';
    END IF;

    why := CASE _validate_handler.kind
        WHEN 'notify' THEN
            CASE WHEN coalesce(target, '') = '' THEN 'a notify handler needs a channel name as target'
                 ELSE 'channel name ' || relay._quote(target) || ': ' ||
                      CASE WHEN octet_length(target) > 63 THEN 'longer than 63 bytes'
                           WHEN target !~ '^[A-Za-z_]' THEN 'must start with a letter or ''_'''
                           WHEN target ~ '[^A-Za-z0-9_]' THEN
                                relay._describe_char(substring(target FROM '[^A-Za-z0-9_]'))
                                || ' is not allowed (only A-Z, a-z, 0-9 and ''_'')' END END
        WHEN 'http' THEN
            CASE WHEN coalesce(target, '') = '' THEN 'an http handler needs a URL as target'
                 ELSE relay._url_error(target) END
        WHEN 'pull' THEN
            CASE WHEN coalesce(target, '') <> '' THEN 'a pull handler takes no target (use NULL)' END
        WHEN 'kafka' THEN
            CASE WHEN coalesce(target, '') = '' THEN 'a kafka handler needs kafka://host:port/topic as target'
                 ELSE relay._kafka_target_error(target) END END;
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'invalid target for a % handler', _validate_handler.kind
            USING ERRCODE = 'invalid_parameter_value', DETAIL = why;
    END IF;

    IF options IS NOT NULL AND jsonb_typeof(options) <> 'object' THEN
        RAISE EXCEPTION 'invalid option: options must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- In the core's order (names sorted bytewise), so the first bad option
    -- reported is the same one.
    FOR opt IN SELECT e.key, e.value FROM jsonb_each(coalesce(options, '{}')) e ORDER BY e.key COLLATE "C" LOOP
        kinds := CASE opt.key
            WHEN 'max_attempts' THEN '{notify,http,pull,kafka}' WHEN 'backoff_base' THEN '{notify,http,pull,kafka}'
            WHEN 'backoff_max' THEN '{notify,http,pull,kafka}' WHEN 'lease' THEN '{notify,http,pull,kafka}'
            WHEN 'timeout' THEN '{http,kafka}' WHEN 'concurrency' THEN '{notify,http,kafka}'
            WHEN 'secret' THEN '{http}' WHEN 'headers' THEN '{http}' WHEN 'ack' THEN '{notify}'
            WHEN 'inline_payload' THEN '{notify}' WHEN 'envelope' THEN '{http,kafka}'
            WHEN 'producer' THEN '{kafka}' WHEN 'key_window' THEN '{kafka}'
            WHEN 'retry_4xx' THEN '{http}' WHEN 'follow_redirects' THEN '{http}'
            WHEN 'max_concurrency' THEN '{http,kafka}' WHEN 'rate' THEN '{http,kafka}'
            WHEN 'burst' THEN '{http,kafka}'
            WHEN 'cloudevents' THEN '{http,kafka}' WHEN 'cloudevents_source' THEN '{http,kafka}' END;
        why := NULL;
        IF kinds IS NULL THEN
            why := 'unknown option ' || relay._quote(opt.key);
        ELSIF jsonb_typeof(opt.value) = 'null' THEN
            CONTINUE;   -- restores the default (relay_alter_handler merges it in to remove an option)
        ELSIF NOT _validate_handler.kind = ANY (kinds) THEN
            why := 'option ' || relay._quote(opt.key) || ' is only valid for ' ||
                   CASE array_to_string(kinds, ',') WHEN 'http,kafka' THEN 'http and kafka handlers'
                        WHEN 'notify,http,kafka' THEN 'notify, http and kafka handlers'
                        ELSE array_to_string(kinds, ',') || ' handlers' END;
        ELSIF opt.key IN ('max_attempts', 'concurrency', 'key_window') THEN
            n := CASE WHEN jsonb_typeof(opt.value) = 'number' THEN (opt.value #>> '{}')::numeric END;
            IF n IS NULL OR n <> trunc(n) OR n < 1 OR n > (CASE opt.key WHEN 'concurrency' THEN 1024 ELSE 1000 END) THEN
                why := 'option "' || opt.key || '" must be an integer between 1 and '
                       || CASE opt.key WHEN 'concurrency' THEN 1024 ELSE 1000 END;
            END IF;
        ELSIF opt.key IN ('max_concurrency', 'burst') THEN
            n := CASE WHEN jsonb_typeof(opt.value) = 'number' THEN (opt.value #>> '{}')::numeric END;
            IF n IS NULL OR n <> trunc(n) OR n < 1 OR n > 100000 THEN
                why := 'option "' || opt.key || '" must be an integer between 1 and 100000';
            ELSIF opt.key = 'burst' THEN
                has_burst := true;
            END IF;
        ELSIF opt.key = 'rate' THEN
            n := CASE WHEN jsonb_typeof(opt.value) = 'number' THEN (opt.value #>> '{}')::numeric END;
            IF n IS NULL OR n <= 0 OR n > 100000 THEN
                why := 'option "rate" must be a number of deliveries per second greater than 0 and at most 100000';
            ELSE
                has_rate := true;
            END IF;
        ELSIF opt.key IN ('backoff_base', 'backoff_max', 'timeout', 'lease') THEN
            ms := CASE WHEN jsonb_typeof(opt.value) = 'string' THEN relay._duration_ms(opt.value #>> '{}') END;
            IF ms IS NULL THEN
                why := 'option "' || opt.key || '" must be an interval such as '''
                       || CASE opt.key WHEN 'backoff_base' THEN '1s' WHEN 'backoff_max' THEN '10min' ELSE '30s' END
                       || ''' (got ' || relay._json_excerpt(opt.value) || ')';
            ELSIF ms < (CASE opt.key WHEN 'lease' THEN 1000 ELSE 1 END)
                  OR ms > (CASE opt.key WHEN 'backoff_max' THEN 7 * 86400000 WHEN 'timeout' THEN 3600000 ELSE 86400000 END) THEN
                why := 'option "' || opt.key || '" must be between '
                       || relay._format_ms(CASE opt.key WHEN 'lease' THEN 1000 ELSE 1 END) || ' and '
                       || relay._format_ms(CASE opt.key WHEN 'backoff_max' THEN 7 * 86400000 WHEN 'timeout' THEN 3600000 ELSE 86400000 END)
                       || ' (got ' || relay._json_excerpt(opt.value) || ')';
            ELSIF opt.key = 'backoff_base' THEN
                base_ms := ms;
            ELSIF opt.key = 'backoff_max' THEN
                max_ms := ms;
            END IF;
        ELSIF opt.key IN ('ack', 'envelope', 'retry_4xx', 'follow_redirects', 'inline_payload') THEN
            IF jsonb_typeof(opt.value) <> 'boolean' THEN
                why := 'option ' || relay._quote(opt.key) || ' must be true or false';
            ELSIF opt.key = 'envelope' THEN
                envelope_asked := opt.value = 'true';
            END IF;
        ELSIF opt.key = 'cloudevents' THEN
            IF opt.value NOT IN ('"binary"', '"structured"') THEN
                why := 'option "cloudevents" must be "binary" or "structured" (got ' || relay._json_excerpt(opt.value) || ')';
            END IF;
            cloudevents_on := true;
        ELSIF opt.key = 'cloudevents_source' THEN
            s := CASE WHEN jsonb_typeof(opt.value) = 'string' THEN opt.value #>> '{}' END;
            IF coalesce(s, '') = '' THEN
                why := 'option "cloudevents_source" must be a non-empty string, a URI-reference such as "/orders"';
            ELSIF octet_length(s) > 1024 THEN
                why := 'option "cloudevents_source" is longer than 1024 bytes';
            ELSE
                -- The first offending character, as the core walks them.
                FOR i IN 1 .. length(s) LOOP
                    IF ascii(substr(s, i, 1)) NOT BETWEEN 33 AND 126 OR strpos('"<>\^`{|}', substr(s, i, 1)) > 0 THEN
                        why := 'option "cloudevents_source": ' || relay._describe_char(substr(s, i, 1))
                               || ' is not allowed in a URI-reference (percent-encode it)';
                    ELSIF substr(s, i, 1) = '%' AND substr(s, i + 1, 2) !~ '^[0-9A-Fa-f]{2}$' THEN
                        why := 'option "cloudevents_source" has a ''%'' not followed by two hex digits';
                    END IF;
                    EXIT WHEN why IS NOT NULL;
                END LOOP;
            END IF;
        ELSIF opt.key = 'secret' THEN
            IF jsonb_typeof(opt.value) = 'string' THEN
                secrets := ARRAY[opt.value #>> '{}'];
            ELSIF jsonb_typeof(opt.value) = 'array' AND jsonb_array_length(opt.value) BETWEEN 1 AND 10
                  AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(opt.value) x WHERE jsonb_typeof(x) <> 'string') THEN
                secrets := ARRAY(SELECT x FROM jsonb_array_elements_text(opt.value) WITH ORDINALITY AS t(x, o) ORDER BY o);
            ELSE
                why := 'option "secret" must be a string or an array of 1 to 10 strings';
            END IF;
            i := 0;
            FOREACH s IN ARRAY coalesce(secrets, '{}') LOOP
                EXIT WHEN why IS NOT NULL;
                i := i + 1;
                key := relay._base64(substr(s, 7));
                IF left(s, 6) <> 'whsec_' OR key IS NULL OR octet_length(key) NOT BETWEEN 1 AND 256 THEN
                    why := 'option "secret" must be "whsec_" followed by the base64 of 1 to 256 bytes'
                           || CASE WHEN jsonb_typeof(opt.value) = 'array' THEN ' (element ' || i || ')' ELSE '' END;
                END IF;
            END LOOP;
        ELSIF opt.key = 'headers' THEN
            IF jsonb_typeof(opt.value) <> 'object' THEN
                why := 'option "headers" must be a JSON object of string values';
            ELSIF (SELECT count(*) FROM jsonb_object_keys(opt.value)) > 100 THEN
                why := 'option "headers" has more than 100 headers';
            ELSE
                FOR hdr IN SELECT e.key, e.value FROM jsonb_each(opt.value) e ORDER BY e.key COLLATE "C" LOOP
                    IF hdr.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' OR octet_length(hdr.key) > 256 THEN
                        why := 'option "headers": ' || relay._quote(hdr.key) || ' is not a valid header name';
                    ELSIF lower(hdr.key) IN ('webhook-id', 'webhook-timestamp', 'webhook-signature', 'content-type',
                                             'content-length', 'host', 'transfer-encoding', 'connection') THEN
                        why := 'option "headers": header ' || relay._quote(hdr.key) || ' is set by relaybus';
                    ELSIF lower(hdr.key) = ANY (seen) THEN
                        why := 'option "headers": header ' || relay._quote(hdr.key) || ' appears twice';
                    ELSIF jsonb_typeof(hdr.value) <> 'string' THEN
                        why := 'option "headers" must be a JSON object of string values (header ' || relay._quote(hdr.key) || ')';
                    ELSIF octet_length(hdr.value #>> '{}') > 8192 THEN
                        why := 'option "headers": value of header ' || relay._quote(hdr.key) || ' is longer than 8192 bytes';
                    ELSIF (hdr.value #>> '{}') ~ '[\x01-\x08\x0a-\x1f\x7f]' THEN
                        why := 'option "headers": value of header ' || relay._quote(hdr.key)
                               || ' contains a control character ('
                               || relay._describe_char(substring(hdr.value #>> '{}' FROM '[\x01-\x08\x0a-\x1f\x7f]')) || ')';
                    END IF;
                    EXIT WHEN why IS NOT NULL;
                    seen := seen || lower(hdr.key);
                END LOOP;
            END IF;
        ELSIF opt.key = 'producer' THEN
            -- librdkafka's own checks of each property are the extension's
            -- alone (docs/managed.md).
            IF jsonb_typeof(opt.value) <> 'object' THEN
                why := 'option "producer" must be a JSON object of librdkafka properties with string values';
            ELSIF (SELECT count(*) FROM jsonb_object_keys(opt.value)) > 200 THEN
                why := 'option "producer" has more than 200 properties';
            ELSE
                why := (SELECT CASE WHEN jsonb_typeof(e.value) <> 'string'
                                    THEN 'option "producer" must be a JSON object of librdkafka properties with string values (property '
                                         || relay._quote(e.key) || ')'
                                    ELSE relay._kafka_property_error(e.key, e.value #>> '{}') END
                          FROM jsonb_each(opt.value) e
                         WHERE jsonb_typeof(e.value) <> 'string' OR relay._kafka_property_error(e.key, e.value #>> '{}') IS NOT NULL
                         ORDER BY e.key COLLATE "C" LIMIT 1);
            END IF;
        END IF;
        IF why IS NOT NULL THEN
            RAISE EXCEPTION 'invalid option: %', why USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    IF has_burst AND NOT has_rate THEN
        RAISE EXCEPTION 'invalid option: option "burst" needs option "rate"' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_ms < base_ms THEN
        RAISE EXCEPTION 'invalid option: option "backoff_max" (%) must not be less than backoff_base (%)',
            relay._format_ms(max_ms), relay._format_ms(base_ms) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF envelope_asked AND cloudevents_on THEN
        RAISE EXCEPTION 'invalid option: option "cloudevents" cannot be combined with "envelope": true (the CloudEvent takes the envelope''s place)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    i := 0;
    FOREACH s IN ARRAY coalesce(secrets, '{}') LOOP
        i := i + 1;
        IF octet_length(relay._base64(substr(s, 7))) < 24 THEN
            RAISE EXCEPTION 'invalid option: option "secret" must be a key of at least 24 bytes (Standard Webhooks)%',
                CASE WHEN cardinality(secrets) > 1 THEN ' (element ' || i || ')' ELSE '' END
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Use "whsec_" followed by the base64 of 32 random bytes (openssl rand -base64 32).';
        END IF;
    END LOOP;
    RETURN jsonb_build_object('target', nullif(target, ''), 'secrets', coalesce(to_jsonb(secrets), '[]'),
                              'options', coalesce(options, '{}') - 'secret');
END
$$;

-- core::describe_value of a non-string JSON value: its text, cut at 40 bytes.
CREATE FUNCTION relay._json_excerpt(v jsonb) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE WHEN jsonb_typeof(v) = 'string' THEN relay._quote(v #>> '{}')
                WHEN octet_length(v::text) > 40 THEN left(v::text, 40) || '...'
                ELSE v::text END
$$;

-- Strict base64 (core::base64_decode): NULL if not base64.
CREATE FUNCTION relay._base64(t text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    IF t !~ '^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$' THEN
        RETURN NULL;
    END IF;
    RETURN decode(t, 'base64');
END
$$;

CREATE FUNCTION relay._validate_route(pattern text, wire_name text)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    why text;
BEGIN
    PERFORM relay._check_topic(pattern, true);
    why := relay._topic_error(wire_name, false);
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'invalid wire name "%"', wire_name
            USING ERRCODE = 'invalid_parameter_value', DETAIL = why;
    END IF;
END
$$;

-- A catalog change can make deliveries ready that no publish announces (a
-- resumed handler, a new route): agents listening on relaybus reload.
CREATE FUNCTION relay._catalog_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relaybus', 'catalog');
    RETURN NULL;
END
$$;

CREATE FUNCTION relay._leases(OUT delivery_id bigint, OUT handler_id integer,
                              OUT lease_until timestamptz, OUT owner_pid integer)
RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT l.delivery_id, l.handler_id, l.lease_until, l.owner_pid FROM relay.leases l
     WHERE relay._is_lease(l.completed_by)
$$;

-- The agents' own counters (relay.agent_reports, relay._agent_report): one
-- row per agent that reported within its stale_after, numbered by start.
-- lanes_held is NULL: an agent leases handlers' deliveries, not lanes.
CREATE FUNCTION relay._workers(OUT pid integer, OUT worker integer, OUT lanes_held integer,
                               OUT delivered bigint, OUT failed bigint, OUT last_error text,
                               OUT started_at timestamptz, OUT heartbeat timestamptz)
RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.backend_pid, (row_number() OVER (ORDER BY r.started_at, r.agent) - 1)::integer, NULL::integer,
           (r.counters->>'delivered')::bigint, (r.counters->>'failed')::bigint,
           nullif(r.counters->>'last_error', ''), r.started_at, r.reported_at
      FROM relay.agent_reports r
     WHERE r.handler = '' AND r.stale_after > now()
$$;

-- The extension counts these in shared memory since server start; here they
-- are the sums of what the live agents reported (relay.agent_reports), each
-- since it started: a completion by a consumer (relay_ack) is not counted,
-- no row is written per completion. A fire-mode notify handler's NOTIFYs
-- count as delivered. The latencies are the largest of the agents' (their
-- histograms are not merged); an open breaker shows until the report that
-- said so goes stale. The HTTP status classes are not reported (NULL).
CREATE FUNCTION relay._handler_counters(OUT handler_id integer, OUT delivered bigint,
                                        OUT retried bigint, OUT dead_lettered bigint,
                                        OUT latency_p50_ms float8, OUT latency_p99_ms float8,
                                        OUT http_2xx bigint, OUT http_3xx bigint, OUT http_4xx bigint,
                                        OUT http_5xx bigint, OUT http_errors bigint,
                                        OUT breaker_until timestamptz)
RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT h.id,
           sum(coalesce((r.counters->>'delivered')::bigint, 0)
               + CASE WHEN h.kind = 'notify' AND NOT coalesce((h.options->>'ack')::boolean, false)
                      THEN coalesce((r.counters->>'notified')::bigint, 0) ELSE 0 END)::bigint,
           sum(coalesce((r.counters->>'retried')::bigint, 0))::bigint,
           sum(coalesce((r.counters->>'dead')::bigint, 0))::bigint,
           max((r.counters->>'latency_p50_ms')::float8), max((r.counters->>'latency_p99_ms')::float8),
           sum((r.counters->>'http_2xx')::bigint)::bigint, sum((r.counters->>'http_3xx')::bigint)::bigint,
           sum((r.counters->>'http_4xx')::bigint)::bigint, sum((r.counters->>'http_5xx')::bigint)::bigint,
           sum((r.counters->>'http_errors')::bigint)::bigint,
           max(r.stale_after) FILTER (WHERE (r.counters->>'breaker_open')::boolean)
      FROM relay.agent_reports r JOIN relay.handlers h ON h.name = r.handler
     WHERE r.stale_after > now()
     GROUP BY h.id
$$;

-- FNV-1a 64 of the key's bytes, mod 64 (core::lane_for_key). The low 6 bits of
-- a product and of an xor depend only on the low 6 bits of their operands, so
-- the hash is carried mod 64: 37 is the offset basis mod 64, 51 the prime's.
CREATE FUNCTION relay.lane_of(key text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    b bytea := convert_to(key, getdatabaseencoding());
    h integer := 37;
BEGIN
    FOR i IN 0 .. octet_length(b) - 1 LOOP
        h := ((h # (get_byte(b, i) & 63)) * 51) & 63;
    END LOOP;
    RETURN h;
END
$$;

-- pending is counted from the table (not a constant cost, unlike the
-- extension's counter kept at commit).
CREATE FUNCTION relay._handler_totals(OUT handler_id integer, OUT published bigint,
                                      OUT latency_sum_seconds float8, OUT pending bigint)
RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT d.handler_id, NULL::bigint, NULL::float8, count(*) FROM relay.deliveries d GROUP BY d.handler_id
$$;

CREATE FUNCTION relay._pending_counted() RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$;
CREATE FUNCTION relay._recount_pending() RETURNS void LANGUAGE sql VOLATILE AS $$ SELECT $$;
CREATE FUNCTION relay._count_pending(handler_id integer, delta bigint) RETURNS void
LANGUAGE sql VOLATILE AS $$ SELECT $$;

CREATE FUNCTION relay._handler_latency_buckets(OUT handler_id integer, OUT le float8, OUT count bigint)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT NULL::integer, NULL::float8, NULL::bigint WHERE false
$$;

CREATE FUNCTION relay._handler_sends(OUT handler_id integer, OUT sends bigint,
                                     OUT send_p50_ms float8, OUT send_p99_ms float8,
                                     OUT send_sum_seconds float8, OUT delivered_after_gap bigint)
RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT h.id, sum(coalesce((r.counters->>'sends')::bigint, 0))::bigint, NULL::float8, NULL::float8, NULL::float8,
           sum(coalesce((r.counters->>'delivered_after_gap')::bigint, 0))::bigint
      FROM relay.agent_reports r JOIN relay.handlers h ON h.name = r.handler
     WHERE r.stale_after > now()
     GROUP BY h.id
$$;

-- The agents enforce rate and max_concurrency across themselves
-- (docs/managed.md, "Limits across agents"); held_back sums what they
-- reported, limited is whether one of them is holding the handler back.
CREATE FUNCTION relay._handler_limits(OUT handler_id integer, OUT held_back bigint, OUT limited boolean)
RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT h.id, sum(coalesce((r.counters->>'held_back')::bigint, 0))::bigint,
           bool_or(coalesce((r.counters->>'limited')::boolean, false))
      FROM relay.agent_reports r JOIN relay.handlers h ON h.name = r.handler
     WHERE r.stale_after > now()
     GROUP BY h.id
$$;

-- The heads of the handler's four priority classes in the claim index.
CREATE FUNCTION relay._oldest_pending(handler_id integer) RETURNS timestamptz
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT min((SELECT d.published_at FROM relay.deliveries d
                 WHERE d.handler_id = _oldest_pending.handler_id AND d.priority = p
                 ORDER BY d.priority, d.id LIMIT 1))
      FROM generate_series(0, 3) AS p
$$;

-- core::backoff_ceiling_ms: min(max_ms, base_ms * 2^(attempt-1)), attempt < 1
-- counting as 1, never negative.
CREATE FUNCTION relay._backoff_ceiling_ms(base_ms bigint, max_ms bigint, attempt integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT greatest(0, least(max_ms, (greatest(base_ms, 0)::numeric * power(2::numeric, least(greatest(attempt, 1) - 1, 80)))))::bigint
$$;

CREATE TRIGGER handlers_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON relay.handlers
    FOR EACH STATEMENT EXECUTE FUNCTION relay._catalog_changed();
CREATE TRIGGER routes_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON relay.routes
    FOR EACH STATEMENT EXECUTE FUNCTION relay._catalog_changed();

-- The SQL edition keeps no count of the malformed trace context values that
-- publishes leave out: each is a WARNING only (docs/managed.md).
CREATE FUNCTION relay._trace_context_ignored() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT NULL::bigint
$$;

-- The edition's version: its upgrade scripts check it (docs/managed.md,
-- "Upgrades"). The build writes it in from relaybus.control.
CREATE FUNCTION relay._managed_version() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT '@RELAYBUS_VERSION@'::text $$;
