#!/usr/bin/env bash
# A Debian root made with debootstrap, for proving the README's commands on a
# fresh machine (scripts/fresh-root.sh) and for the PostgreSQL version lanes
# (test/matrix.sh).
#
#   scripts/debian-root.sh create RELEASE DIR   debootstrap --variant=minbase RELEASE into DIR,
#                                               then install git, make and ca-certificates
#   scripts/debian-root.sh run DIR COMMAND      run COMMAND (bash -c) as root inside DIR
#
# RELEASE is bookworm, trixie, sid, or experimental (a sid root whose apt also
# reads Debian's experimental suite, at the default low priority: install from
# it with `apt-get install -t experimental`). Apt inside a sid or experimental
# root ignores an expired Release file (Acquire::Check-Valid-Until "false"):
# the development suites' files on a mirror may be older than their Valid-Until.
#
# `run` mounts /proc, /sys, /dev, /dev/pts, /dev/shm and binds the root onto
# itself (so "/" inside is a mount point, as tests that use a private mount
# namespace need) in a mount namespace of its own: nothing stays mounted when
# COMMAND ends, whatever ends it, and two runs in two roots never meet. The
# environment inside is empty but HOME, TERM, LANG, PATH, CI and the variables
# named in RELAYBUS_ROOT_ENV (space separated).
#
# The root gets nothing from this machine but /etc/resolv.conf (apt inside needs
# the package mirror) and the local CA certificates (a TLS-inspecting proxy in
# front of the registries needs them; a newcomer's machine has its own).
# Needs root; installs debootstrap with apt-get when it is missing.
set -euo pipefail

mirror=${RELAYBUS_DEBIAN_MIRROR:-http://deb.debian.org/debian}

die() { echo "debian-root: $*" >&2; exit 2; }
((EUID == 0)) || die "run as root"

create() {
    local release=$1 dir=$2 suite
    case "$release" in
        bookworm | trixie | sid) suite=$release ;;
        experimental) suite=sid ;;
        *) die "unknown release '$release' (bookworm, trixie, sid or experimental)" ;;
    esac
    if ! command -v debootstrap >/dev/null 2>&1; then
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
    fi
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    debootstrap --variant=minbase "$suite" "$dir" "$mirror" >"$dir.debootstrap.log" 2>&1 ||
        { tail -n 20 "$dir.debootstrap.log" >&2; die "debootstrap $suite failed (log: $dir.debootstrap.log)"; }
    if [[ $suite == sid ]]; then
        echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/99relaybus-valid-until"
    fi
    if [[ $release == experimental ]]; then
        echo "deb $mirror experimental main" >"$dir/etc/apt/sources.list.d/experimental.list"
    fi
    cp /etc/resolv.conf "$dir/etc/resolv.conf"
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        mkdir -p "$dir/usr/local/share/ca-certificates"
        cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
    fi
    run "$dir" "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends git make ca-certificates && update-ca-certificates" \
        >"$dir.setup.log" 2>&1 || { tail -n 20 "$dir.setup.log" >&2; die "setting up $dir failed (log: $dir.setup.log)"; }
    echo "$release" >"$dir/.relaybus-release"
}

run() {
    local dir=$1 cmd=$2 env=(HOME=/root TERM=dumb LANG=C.UTF-8
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin) v
    [[ -d "$dir/etc" ]] || die "$dir is not a root (create it first)"
    for v in CI ${RELAYBUS_ROOT_ENV:-}; do
        [[ -n "${!v+x}" ]] && env+=("$v=${!v}")
    done
    cp /etc/resolv.conf "$dir/etc/resolv.conf"
    unshare -m --propagation private -- bash -c '
        set -e
        dir=$1; shift
        mount --bind "$dir" "$dir"
        mount -t proc proc "$dir/proc"
        mount -t sysfs sys "$dir/sys"
        mount --bind /dev "$dir/dev"
        mount -t devpts devpts "$dir/dev/pts"
        mount -t tmpfs shm "$dir/dev/shm"
        exec chroot "$dir" /usr/bin/env -i "$@"
    ' debian-root "$dir" "${env[@]}" bash -c "$cmd"
}

(($# >= 1)) || die "usage: $0 create RELEASE DIR | run DIR COMMAND"
case "$1" in
    create) (($# == 3)) || die "usage: $0 create RELEASE DIR"; create "$2" "$3" ;;
    run) (($# == 3)) || die "usage: $0 run DIR COMMAND"; run "$2" "$3" ;;
    *) die "unknown command '$1'" ;;
esac
