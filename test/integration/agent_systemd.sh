#!/usr/bin/env bash
# packaging/relaybus-agent.service, relaybus-agent's systemd unit
# (docs/managed.md, "Running it under systemd"), without systemd as PID 1:
#  (1) `systemd-analyze verify` of the unit as shipped, in a root that has it
#      in /etc/systemd/system, the agent at its ExecStart path and Debian's
#      system units: nothing to say, exit 0 (and it does complain about a
#      misspelt key and a missing binary: the check can fail);
#  (2) the unit's ExecStart run as written (read from the file: systemd's
#      $VAR word splitting, %d, its Environment= lines, the site's
#      EnvironmentFile, LoadCredential's copy of the pgpass file in
#      $CREDENTIALS_DIRECTORY; the one substitution is the binary's path, to
#      the one just built) against a cluster without relaybus whose agent role
#      needs a password: it connects with the pgpass the unit points at,
#      delivers, and SIGTERM ends it with 0 within TimeoutStopSec;
#  (3) the exit codes Restart=on-failure and RestartPreventExitStatus=2 rely
#      on: bad usage and a database without the edition exit 2, which the
#      unit lists; a missing password is retried inside, never an exit.
export PGHOST=${PGHOST:-/nonexistent} PGPORT=${PGPORT:-1}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/managed_lib.sh"
managed_traps

UNIT=$RELAYBUS_ROOT/packaging/relaybus-agent.service
AGENT=$RELAYBUS_ROOT/relaybus-agent
INSTALLED=/usr/local/bin/relaybus-agent # the unit's ExecStart path
command -v systemd-analyze >/dev/null || die "systemd-analyze is needed (Debian package systemd: scripts/install-deps.sh)"
DB=unitdb
OWNER=relay_owner
log "building relaybus-agent and the managed script; a cluster without relaybus"
agent_database "$OWNER" "$DB"

# (1) systemd-analyze verify, in a root of its own (it looks for the binary
# and the units the service depends on there).
ROOT=$TMP/root
mkdir -p "$ROOT/etc/systemd/system" "$ROOT$(dirname "$INSTALLED")" "$ROOT/usr/lib/systemd"
cp -a /usr/lib/systemd/system "$ROOT/usr/lib/systemd/" || die "no system units in /usr/lib/systemd/system"
cp "$AGENT" "$ROOT$INSTALLED"
cp "$UNIT" "$ROOT/etc/systemd/system/relaybus-agent.service"
verify() { systemd-analyze verify --root="$ROOT" "/etc/systemd/system/$1" 2>&1; }
out=$(verify relaybus-agent.service)
check_eq "(1) systemd-analyze verify: exit 0, nothing to say" "0|" "$?|$out"
sed 's/^Restart=/Restarts=/' "$UNIT" >"$ROOT/etc/systemd/system/misspelt.service"
check "(1) ... and it complains about a misspelt key" bash -c "grep -q \"Unknown key 'Restarts'\" <<<\"\$1\"" _ \
    "$(verify misspelt.service)"
rm "$ROOT$INSTALLED"
check "(1) ... and fails without the binary at ExecStart's path" bash -c '! systemd-analyze verify --root="$1" \
    /etc/systemd/system/relaybus-agent.service >/dev/null 2>&1' _ "$ROOT"

# (2) The unit's settings, read from the file.
unit_value() { sed -n "s/^$1=//p" "$UNIT"; }
check_eq "(2) the unit's ExecStart" "$INSTALLED \$RELAYBUS_AGENT_OPTIONS" "$(unit_value ExecStart)"
check_eq "(2) its site settings come from one EnvironmentFile" "/etc/relaybus/agent.env" "$(unit_value EnvironmentFile)"
stop_s=$(unit_value TimeoutStopSec)
stop_s=${stop_s%s}
[[ $stop_s =~ ^[0-9]+$ ]] || die "TimeoutStopSec=$stop_s is not in seconds"
read -r -a prevent <<<"$(unit_value RestartPreventExitStatus)"
check_eq "(2) Restart=on-failure" on-failure "$(unit_value Restart)"

# A password for the agent's role, required on TCP from 127.0.0.1, and the
# site's pgpass file, handed over as LoadCredential= does.
PASSWORD=unit-$RANDOM$RANDOM
psql_q -U postgres -d postgres -c "ALTER ROLE agent_login PASSWORD '$PASSWORD'" >/dev/null || die "password"
sed -i "1i host all agent_login 127.0.0.1/32 scram-sha-256" "$CLUSTER/data/pg_hba.conf"
psql_q -U postgres -d postgres -c "SELECT pg_reload_conf()" >/dev/null || die "reload"
CREDS=$TMP/credentials
mkdir -p "$CREDS" "$TMP/etc"
IFS=: read -r cred_name cred_src <<<"$(unit_value LoadCredential)"
check_eq "(2) LoadCredential: the pgpass from /etc/relaybus" "pgpass:/etc/relaybus/pgpass" "$cred_name:$cred_src"
echo "127.0.0.1:$PGPORT:$DB:agent_login:$PASSWORD" >"$TMP/etc/pgpass"
chmod 600 "$TMP/etc/pgpass"

# run_unit NAME ENVFILE: ExecStart as systemd runs it, in the background
# (AGENT_PID, log $TMP/NAME.log), with a clean environment: the unit's
# Environment= lines (%d: the credentials directory), then ENVFILE's (the
# site's /etc/relaybus/agent.env), $VAR split at whitespace, ${VAR} whole.
run_unit() {
    local name=$1 envfile=$2 argv=() envs=()
    rm -rf "$CREDS"/*
    cp "$TMP/etc/pgpass" "$CREDS/$cred_name"
    mapfile -d '' argv < <(python3 - "$UNIT" "$envfile" "$CREDS" "$INSTALLED" "$AGENT" env <<'PY'
import re, shlex, sys
unit, envfile, creds, installed, built, what = sys.argv[1:]
env, argv = {}, None
def spec(s):
    def one(m):
        if m[1] == "d": return creds
        if m[1] == "%": return "%"
        sys.exit("specifier %" + m[1] + " not handled by this test")
    return re.sub(r"%(.)", one, s)
for line in open(unit):
    line = line.strip()
    if line.startswith("Environment="):
        for a in shlex.split(line[len("Environment="):]):
            k, v = a.split("=", 1)
            env[k] = spec(v)
    elif line.startswith("ExecStart="):
        argv = line[len("ExecStart="):]
for line in open(envfile):
    line = line.strip()
    if line and not line.startswith("#"):
        k, v = line.split("=", 1)
        env[k] = " ".join(shlex.split(v))
words = []
for w in shlex.split(argv):
    m = re.fullmatch(r"\$(\w+)", w)
    if m: words += env.get(m[1], "").split(); continue
    m = re.fullmatch(r"\$\{(\w+)\}", w)
    words.append(env.get(m[1], "") if m else spec(w))
if words[0][0] in "@-:+!": sys.exit("ExecStart prefixes are not handled by this test")
if words[0] != installed: sys.exit("ExecStart runs " + words[0] + ", not " + installed)
words[0] = built
out = ["CREDENTIALS_DIRECTORY=" + creds, "PATH=/usr/local/bin:/usr/bin:/bin"] + [k + "=" + v for k, v in env.items()]
sys.stdout.write("\0".join(out + ["--"] + words) + "\0")
PY
    )
    local i
    for ((i = 0; i < ${#argv[@]}; i++)); do
        [[ ${argv[i]} == -- ]] && break
        envs+=("${argv[i]}")
    done
    argv=("${argv[@]:i+1}")
    ((${#argv[@]} > 0)) || die "could not read ExecStart from the unit"
    printf '%q ' env -i "${envs[@]}" "${argv[@]}" >"$TMP/$name.cmd"
    env -i "${envs[@]}" "${argv[@]}" 2>"$TMP/$name.log" &
    AGENT_PID=$!
    bg_track "$AGENT_PID"
}
site_env() {
    printf 'RELAYBUS_AGENT_DATABASE="host=127.0.0.1 port=%s dbname=%s user=agent_login"\n' "$PGPORT" "${2:-$DB}" >"$1"
    printf 'RELAYBUS_AGENT_OPTIONS="%s"\n' "${3:---metrics-addr 127.0.0.1:0 --poll-interval 200ms}" >>"$1"
}
log_has() { grep -qF -- "$2" "$TMP/$1.log"; }

psql_q -U "$OWNER" -d "$DB" -c "SELECT relay_create_handler('unit_nf', 'notify', 'unit_chan')" \
    -c "SELECT relay_route('unit.#', 'unit_nf')" >/dev/null || die "handler"
start_client c "$DB" unit_chan || die "listen_client did not start"
site_env "$TMP/agent.env"
run_unit ok "$TMP/agent.env"
check "(2) the agent connects (the password from \$CREDENTIALS_DIRECTORY/pgpass)" \
    wait_until 30 log_has ok '"msg":"handlers loaded"'
check "(2) with the options of RELAYBUS_AGENT_OPTIONS (metrics on a port of its own)" log_has ok '"msg":"metrics listening"'
psql_q -U "$OWNER" -d "$DB" -c "SELECT relay_publish('unit.x', jsonb_build_object('n', n), 'k') FROM generate_series(1, 5) n" \
    >/dev/null
check "(2) it delivers" wait_lines "$TMP/c.out" 5 20
kill -TERM "$AGENT_PID"
wait_pid "$AGENT_PID" "$stop_s"
check_eq "(2) SIGTERM: exit 0 within TimeoutStopSec=${stop_s}s" 0 "$WAIT_RC"
check "(2) it logged stopping" log_has ok '"msg":"stopped"'

# (3) Exit codes.
in_prevent() { local c; for c in "${prevent[@]}"; do [[ $c == "$1" ]] && return 0; done; return 1; }
site_env "$TMP/bad.env" "$DB" "--batch-size 0"
run_unit bad "$TMP/bad.env"
wait_pid "$AGENT_PID" 30
check_eq "(3) bad usage (--batch-size 0 in RELAYBUS_AGENT_OPTIONS): exit 2" 2 "$WAIT_RC"
check "(3) ... which RestartPreventExitStatus lists: no restart loop" in_prevent "$WAIT_RC"
echo "127.0.0.1:$PGPORT:postgres:agent_login:$PASSWORD" >>"$TMP/etc/pgpass"
site_env "$TMP/plain.env" postgres
run_unit plain "$TMP/plain.env"
wait_pid "$AGENT_PID" 30
check_eq "(3) a database without the edition: exit 2" 2 "$WAIT_RC"
check "(3) ... which RestartPreventExitStatus lists" in_prevent "$WAIT_RC"
check "(3) ... with one clear line" log_has plain "relaybus-agent's functions is not installed"

# No password: libpq's error, retried inside; the service stays up.
: >"$TMP/etc/pgpass"
run_unit nopass "$TMP/agent.env"
check "(3) a missing password is logged" wait_until 30 log_has nopass '"msg":"cannot connect to the database"'
check "(3) ... and retried" wait_until 30 log_has nopass '"msg":"reconnecting later"'
check "(3) ... without an exit" kill -0 "$AGENT_PID"
kill -TERM "$AGENT_PID"
wait_pid "$AGENT_PID" "$stop_s"
check_eq "(3) SIGTERM while reconnecting: exit 0" 0 "$WAIT_RC"
finish
