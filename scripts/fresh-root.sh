#!/usr/bin/env bash
# Proves the README's two commands on a fresh Debian, as a newcomer would run
# them: debootstrap --variant=minbase RELEASE into DIR, install only git, make
# and ca-certificates inside (scripts/debian-root.sh), clone this repository
# (its committed HEAD) and run `make demo` and then `make test` there as root.
# Prints each command's duration and last lines; the full logs stay in
# DIR/relaybus-*.log.
#
#   scripts/fresh-root.sh [RELEASE] [DIR]
#       RELEASE  bookworm (Debian 12, the default) or trixie (Debian 13)
#       DIR      default /var/tmp/relaybus-fresh-RELEASE (wiped first)
#
# Needs root and debootstrap (installed with apt-get when missing). The root
# gets nothing from the host but /etc/resolv.conf and the local CA certificates.
set -euo pipefail
((EUID == 0)) || { echo "fresh-root: run as root" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd -P)
release=${1:-bookworm}
case "$release" in
    bookworm | trixie) ;;
    *) echo "fresh-root: RELEASE is bookworm or trixie, not '$release'" >&2; exit 2 ;;
esac
dir=${2:-/var/tmp/relaybus-fresh-$release}

t0=$(date +%s)
echo "fresh-root: debootstrap --variant=minbase $release $dir"
bash "$root/scripts/debian-root.sh" create "$release" "$dir"
git clone -q "$root" "$dir/root/relaybus"
echo "fresh-root: root ready in $(($(date +%s) - t0)) s; /etc/hosts: $(cat "$dir/etc/hosts" 2>/dev/null | tr '\n' ';' || echo none)"

rc=0
for cmd in demo test; do
    t=$(date +%s)
    set +e
    bash "$root/scripts/debian-root.sh" run "$dir" "cd /root/relaybus && make $cmd" >"$dir/relaybus-$cmd.log" 2>&1
    status=$?
    set -e
    echo
    echo "fresh-root: $release: make $cmd: exit $status after $(($(date +%s) - t)) s; last lines:"
    tail -n 8 "$dir/relaybus-$cmd.log" | sed 's/^/    /'
    ((status == 0)) || rc=1
done
exit "$rc"
