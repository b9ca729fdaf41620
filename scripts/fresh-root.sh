#!/usr/bin/env bash
# Proves the README's two commands on a fresh Debian 12, as a newcomer would run
# them: debootstrap --variant=minbase bookworm into DIR, install only git, make
# and ca-certificates inside, clone this repository (its committed HEAD) and run
# `make demo` and then `make test` there as root. Prints each command's duration
# and last lines; the full logs stay in DIR/relaybus-*.log.
#
#   scripts/fresh-root.sh [DIR]      default /var/tmp/relaybus-fresh-root (wiped first)
#
# Needs root and debootstrap (installed with apt-get when missing). The root
# gets no /etc/hosts entry for this machine's name and nothing else from the
# host but /etc/resolv.conf (apt inside needs the package mirror) and the
# host's local CA certificates.
set -euo pipefail
((EUID == 0)) || { echo "fresh-root: run as root" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd -P)
dir=${1:-/var/tmp/relaybus-fresh-root}
mirror=${RELAYBUS_DEBIAN_MIRROR:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
fi

# The root is bind-mounted onto itself first (as arch-chroot does), so that "/"
# inside is a mount point: tests that use a private mount namespace
# (unshare -m --propagation private) need that, as on a real machine.
mounts=("" proc sys dev dev/pts dev/shm)
unmount_all() {
    local i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        mountpoint -q "$dir/${mounts[i]}" && umount -l "$dir/${mounts[i]}"
    done
    return 0
}
trap unmount_all EXIT

if [[ -d "$dir" ]]; then
    unmount_all
    rm -rf "$dir"
fi
t0=$(date +%s)
echo "fresh-root: debootstrap --variant=minbase bookworm $dir"
debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.debootstrap.log" 2>&1 ||
    { tail -n 20 "$dir.debootstrap.log"; exit 1; }
mount --bind "$dir" "$dir"
mount -t proc proc "$dir/proc"
mount -t sysfs sys "$dir/sys"
mount --bind /dev "$dir/dev"
mount -t devpts devpts "$dir/dev/pts"
mount -t tmpfs shm "$dir/dev/shm"
cp /etc/resolv.conf "$dir/etc/resolv.conf"

in_root() { chroot "$dir" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -c "$1"; }
in_root "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends git make ca-certificates" \
    >"$dir/relaybus-setup.log" 2>&1 || { tail -n 20 "$dir/relaybus-setup.log"; exit 1; }
# Local CA certificates of this machine (a TLS-inspecting proxy in front of the
# registries needs them; a newcomer's machine has its own).
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$dir/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
    in_root "update-ca-certificates" >>"$dir/relaybus-setup.log" 2>&1
fi
git clone -q "$root" "$dir/root/relaybus"
echo "fresh-root: root ready in $(($(date +%s) - t0)) s; /etc/hosts: $(cat "$dir/etc/hosts" 2>/dev/null | tr '\n' ';' || echo none)"

rc=0
for cmd in demo test; do
    t=$(date +%s)
    set +e
    in_root "cd /root/relaybus && make $cmd" >"$dir/relaybus-$cmd.log" 2>&1
    status=$?
    set -e
    echo
    echo "fresh-root: make $cmd: exit $status after $(($(date +%s) - t)) s; last lines:"
    tail -n 8 "$dir/relaybus-$cmd.log" | sed 's/^/    /'
    ((status == 0)) || rc=1
done
exit "$rc"
