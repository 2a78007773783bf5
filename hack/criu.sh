#!/usr/bin/env bash
# CRIU 4 for checkpoint/restore on this host (Debian 12): Debian 12's criu 3.17.1 fails
# `criu check` on kernels from 6.13 on ("vdso: Unexpected rt vDSO area bounds", CRIU issue
# 2532), and trixie's and sid's criu packages need a newer glibc. So this builds sid's criu source
# package (4.2.1-1) with Debian 12's toolchain: its upstream tarball, checked against sid's
# Sources index, without Debian's packaging patches (the mirror here does not serve the
# package's debian/ tarball). The binary goes to /usr/local/sbin/criu; the build takes about a
# minute on 2 cores. Idempotent: does nothing when that binary is already this version.
# The VM suite's trixie and sid guests use their packaged criu instead.
#   hack/criu.sh            # as root
set -euo pipefail
version=4.2.1
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# From sid's Sources index (Checksums-Sha256 of criu 4.2.1-1).
orig_sha256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
target=/usr/local/sbin/criu

if [[ $(id -u) != 0 ]]; then
    echo "criu.sh: run as root (it installs build dependencies and $target)" >&2
    exit 1
fi
if [[ -x $target ]] && "$target" --version 2>/dev/null | grep -qx "Version: $version"; then
    echo "criu.sh: $target is criu $version already"
    exit 0
fi

build_deps=(build-essential pkgconf libbsd-dev libcap-dev libgnutls28-dev libnet1-dev
    libnftables-dev libnl-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler
    protobuf-compiler python3-protobuf uuid-dev)
missing=()
for pkg in "${build_deps[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "criu.sh: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
fi

cache=/var/cache/agent-sandbox/criu
install -d "$cache"
fetch() {
    local file=$1 sha=$2
    if ! echo "$sha  $cache/$file" | sha256sum -c --status 2>/dev/null; then
        curl -fsS -m 300 -o "$cache/$file.part" "$mirror/pool/main/c/criu/$file"
        echo "$sha  $cache/$file.part" | sha256sum -c --status || {
            echo "criu.sh: $file does not match sid's checksum" >&2
            exit 1
        }
        mv "$cache/$file.part" "$cache/$file"
    fi
}
fetch "criu_$version.orig.tar.xz" "$orig_sha256"

build=$(mktemp -d /var/tmp/criu-build.XXXXXX)
trap 'rm -rf "$build"' EXIT
tar -xJf "$cache/criu_$version.orig.tar.xz" -C "$build"
src=$(find "$build" -mindepth 1 -maxdepth 1 -type d)
make -C "$src" -j"$(nproc)" criu >"$build/make.log" 2>&1 || {
    tail -n 30 "$build/make.log" >&2
    echo "criu.sh: building criu $version failed" >&2
    exit 1
}
install -m 0755 "$src/criu/criu" "$target.new"
mv -f "$target.new" "$target"
"$target" --version
"$target" check || echo "criu.sh: 'criu check' reports a problem on this kernel (see above)" >&2
