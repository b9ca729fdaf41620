#!/usr/bin/env bash
# Installs the Debian 12 packages that relaybus needs to build, run and test.
# Idempotent: checks each package with dpkg first, so a re-run with everything
# present is fast and needs no network. Runs apt-get (as root, or through sudo)
# only for what is missing.
set -euo pipefail

PACKAGES=(
    build-essential
    make
    postgresql-15
    postgresql-server-dev-15
    postgresql-contrib                       # pg_stat_statements
    clang-14                                 # PGXS (with_llvm=yes) compiles bitcode with /usr/bin/clang-14
    llvm-14
    libgtest-dev
    googletest
    nlohmann-json3-dev
    libcurl4-openssl-dev
    libssl-dev
    postgresql-15-pgtap
    libtap-parser-sourcehandler-pgtap-perl   # pg_prove
    python3
    python3-pip
    nghttp2-server                           # nghttpd: the HTTP/2 TLS peer of the core HTTP tests
    openssl                                  # test certificates
    pkg-config                               # relaybus-mongo's Makefile finds libmongoc with it
    libmongoc-dev                            # relaybus-mongo (libmongoc 1.23 on Debian 12)
    libbson-dev
    python3-pymongo                          # the MongoDB sidecar tests: application-side publishing, raw documents
    curl                                     # the sidecar tests read /metrics
    postgresql-15-pgq3                       # PgQ, a peer in bench/relaybus-bench
    pgqd                                     # PgQ's ticker daemon
    prometheus-postgres-exporter             # the monitoring test scrapes docs/postgres_exporter.yml with it
    prometheus                               # promtool checks the exporter's /metrics
    librdkafka-dev                           # the kafka handler kind's producer (src/core/kafka_sink)
    kcat                                     # the Kafka tests' consumer
    openjdk-17-jre-headless                  # the Kafka tests' broker (scripts/kafka-broker.sh)
    maven                                    # fetches the broker's jars from Maven Central
)
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

missing=()
for pkg in "${PACKAGES[@]}"; do
    is_installed "$pkg" || missing+=("$pkg")
done

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
    echo "install-deps: no Go >= 1.21; installing golang-1.23-go from bookworm-backports"
    local src=/etc/apt/sources.list.d/relaybus-backports.sources
    if [[ ! -f "$src" ]]; then
        printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
            'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
            "${SUDO[@]}" tee "$src" >/dev/null
    fi
    attempt "${SUDO[@]}" apt-get update -q
    attempt "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install "${APT_OPTS[@]}" \
        -t bookworm-backports golang-1.23-go
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
    echo "install-deps: installing ${want[*]}"
    attempt "${SUDO[@]}" apt-get update -q
    attempt "${SUDO[@]}" apt-get install "${APT_OPTS[@]}" "${want[@]}"
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

if ((${#missing[@]} == 0)); then
    echo "install-deps: all ${#PACKAGES[@]} packages present"
    python_deps
    go_deps
    node_deps
    exit 0
fi

echo "install-deps: installing: ${missing[*]}"
if ((EUID != 0 && ${#SUDO[@]} == 0)); then
    echo "install-deps: missing packages and not root (no sudo): ${missing[*]}" >&2
    exit 1
fi

attempt "${SUDO[@]}" apt-get update -q
attempt "${SUDO[@]}" apt-get install "${APT_OPTS[@]}" "${missing[@]}"

still=()
for pkg in "${missing[@]}"; do
    is_installed "$pkg" || still+=("$pkg")
done
if ((${#still[@]} > 0)); then
    echo "install-deps: still missing after apt-get: ${still[*]}" >&2
    exit 1
fi
python_deps
go_deps
node_deps
echo "install-deps: done"
