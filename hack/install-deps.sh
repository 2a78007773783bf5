#!/usr/bin/env bash
# Installs from Debian every package the build, the images and the tests need.
# Idempotent: when every package is already installed it does nothing (no apt-get
# update), so warm reruns cost a dpkg-query.
#
# Recommends are not installed: podman's and containerd's recommends pull in
# services and tools we do not use. Policy-rc.d forbids postinst scripts from
# starting daemons (there is no systemd here; setup starts what it needs itself).
set -euo pipefail

packages=(
    # container engines and OCI runtimes the tests drive or compare against
    podman runc crun conmon containerd containernetworking-plugins catatonit
    # rootless podman: subordinate ids, user-mode networking, fuse overlay
    uidmap slirp4netns fuse-overlayfs
    # image building without a registry
    umoci skopeo busybox-static file
    # the tools image copies these from the host's installed packages
    python3-minimal curl ca-certificates
    # build dependencies (libcontainer/seccomp, CRI protobufs)
    libseccomp-dev pkg-config protobuf-compiler
    # the pause image (bundles/pause): a static C binary
    gcc libc6-dev
    # AppArmor profile validation (apparmor_parser -Q -K), no kernel support here
    apparmor
    # tests and benchmarks
    iproute2 iptables hyperfine jq python3 procps util-linux git
    # promote onto a case-insensitive target: a FAT image, mounted with FUSE (no vfat module)
    dosfstools fusefat
    # The proxy's client tests: git over ssh through netcat's SOCKS mode, TLS via openssl.
    netcat-openbsd openssh-client openssl
    # The VM suite (hack/vm): a systemd + cgroup v2 + AppArmor guest built with debootstrap,
    # its disks made with mke2fs -d and read with debugfs, booted under qemu (TCG). Debian 12's
    # qemu-system-x86 (7.2) installs beside a newer backported qemu-utils.
    qemu-system-x86 debootstrap e2fsprogs
)

missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
    [[ $status == ii* ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
    echo "install-deps: all ${#packages[@]} packages present"
    exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Keep package scripts from starting daemons (exit code 101 = action forbidden).
policy_rc=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy_rc ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy_rc"
    chmod 0755 "$policy_rc"
    created_policy=1
fi
cleanup() { if ((created_policy)); then rm -f "$policy_rc"; fi; }
trap cleanup EXIT

apt_opts=(-o DPkg::Lock::Timeout=900 -o APT::Install-Recommends=false -y -q)
apt-get "${apt_opts[@]}" update
apt-get "${apt_opts[@]}" install "${missing[@]}"
