#!/usr/bin/env bash
# A private PostgreSQL install tree with one build of relaybus in it, so two
# builds (A/B benchmarks, parallel work) never overwrite each other's relaybus.so.
#
#   scripts/pg-tree.sh DIR [REF]
#
# Copies the system's PostgreSQL of the chosen major (scripts/pg-config.sh; e.g.
# /usr/lib/postgresql/NN and /usr/share/postgresql/NN, with every extension
# installed there, e.g. PgQ and pg_stat_statements) into DIR/usr/..., then builds relaybus and installs it
# there with DESTDIR. PostgreSQL's binaries are relocatable: pg_config, initdb
# and postgres under DIR find their share and lib directories under DIR.
#
# REF (a git ref) builds that commit from a detached worktree in DIR/src;
# without REF the current checkout is built (its work tree, uncommitted changes
# included) in place.
#
# Prints the tree's pg_config path last; use it as PG_CONFIG for test/cluster.sh
# or --pg-config for bench/relaybus-bench.
set -euo pipefail

(($# >= 1 && $# <= 2)) || { echo "usage: $0 DIR [REF]" >&2; exit 2; }
dir=$1
ref=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd -P)
SYS_PG_CONFIG=${SYS_PG_CONFIG:-$(bash "$root/scripts/pg-config.sh")}
[[ -x "$SYS_PG_CONFIG" ]] || { echo "pg-tree.sh: no $SYS_PG_CONFIG (run scripts/install-deps.sh)" >&2; exit 1; }

libdir=$(dirname "$("$SYS_PG_CONFIG" --bindir)")    # /usr/lib/postgresql/NN
sharedir=$("$SYS_PG_CONFIG" --sharedir)            # /usr/share/postgresql/NN

mkdir -p "$dir"
dir=$(cd "$dir" && pwd -P)
rm -rf "$dir/usr"
mkdir -p "$dir$(dirname "$libdir")" "$dir$(dirname "$sharedir")"
cp -a "$libdir" "$dir$(dirname "$libdir")/"
cp -a "$sharedir" "$dir$(dirname "$sharedir")/"

src=$root
if [[ -n "$ref" ]]; then
    src=$dir/src
    if [[ -d "$src" ]]; then git -C "$root" worktree remove --force "$src" 2>/dev/null || rm -rf "$src"; fi
    git -C "$root" worktree prune
    git -C "$root" worktree add --detach "$src" "$ref" >/dev/null
    git -C "$src" rev-parse HEAD >"$dir/ref"
else
    { git -C "$root" rev-parse HEAD; git -C "$root" status --porcelain | sed 's/^/dirty: /'; } >"$dir/ref"
fi

# Clients built against the tree (the tests' libpq programs) ask its pg_config for
# headers and libpq: the system's, through links (they are not copied).
sys_include=$("$SYS_PG_CONFIG" --includedir)          # /usr/include/postgresql
sys_libdir=$("$SYS_PG_CONFIG" --libdir)               # /usr/lib/x86_64-linux-gnu
mkdir -p "$dir$(dirname "$sys_include")" "$dir$(dirname "$sys_libdir")"
ln -sfn "$sys_include" "$dir$sys_include"
ln -sfn "$sys_libdir" "$dir$sys_libdir"

# Only this build's relaybus in the tree: the system's copy may hold another
# build's files (a 0.2.0 install script left by a newer build would make an
# older library's CREATE EXTENSION run it and miss its C symbols).
rm -f "$dir$sharedir"/extension/relaybus--*.sql "$dir$sharedir"/extension/relaybus.control \
      "$dir$libdir"/lib/relaybus.so
make -C "$src" -s -j"$(nproc)" PG_CONFIG="$SYS_PG_CONFIG" >/dev/null
make -C "$src" -s PG_CONFIG="$SYS_PG_CONFIG" install DESTDIR="$dir" >/dev/null
# The server runs as postgres when we are root: it must read the tree.
chmod -R a+rX "$dir/usr"
[[ "$dir" == /tmp/* || "$(id -u)" != 0 ]] || chmod a+x "$dir"

tree_pg_config=$dir$("$SYS_PG_CONFIG" --bindir)/pg_config
"$tree_pg_config" --pkglibdir >/dev/null
echo "$tree_pg_config"
