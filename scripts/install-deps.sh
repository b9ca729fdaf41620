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
    libmongoc-dev                            # relaybus-mongo (libmongoc 1.23 on Debian 12)
    libbson-dev
    python3-pymongo                          # the MongoDB sidecar tests: application-side publishing, raw documents
    curl                                     # the sidecar tests read /metrics
    postgresql-15-pgq3                       # PgQ, a peer in bench/relaybus-bench
    pgqd                                     # PgQ's ticker daemon
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

# Go builds FerretDB v1.24.2 (test/ferretdb) for the sidecar tests; it is
# preinstalled on the test machines, otherwise Debian's golang is too old
# (FerretDB v1.24 needs Go >= 1.24); the machines this project runs on have it.
go_check() {
    if ! command -v go >/dev/null 2>&1; then
        echo "install-deps: warning: go not found; test/integration/mongo.sh needs Go >= 1.24 to build FerretDB" >&2
    fi
}

if ((${#missing[@]} == 0)); then
    echo "install-deps: all ${#PACKAGES[@]} packages present"
    python_deps
    go_check
    exit 0
fi

echo "install-deps: installing: ${missing[*]}"

SUDO=()
if ((EUID != 0)); then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "install-deps: missing packages and not root (no sudo): ${missing[*]}" >&2
        exit 1
    fi
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
go_check
echo "install-deps: done"
