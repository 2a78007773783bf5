#!/usr/bin/env bash
# Builds a guest of the VM suite (docs/vm-suite.md): a Debian root filesystem made with
# debootstrap and apt from the mirror this machine's apt already uses, with the systemd,
# podman, containerd, AppArmor and cgroup v2 setup of users' hosts baked in (the guest has no
# network). One recipe per Debian suite:
#   bookworm  Debian 12: kernel 6.1, systemd 252, containerd 1.6, podman 4.3 (CNI networks)
#   trixie    Debian 13: kernel 6.12, containerd 1.7, podman 5 (netavark, nftables, pasta)
#   sid       unstable:  the newest kernel, containerd 2.x, podman 5
# Only the guest gets the suite's packages; this machine's apt configuration is never
# changed. Output, in a cache directory keyed on this script, the baked-in guest files, the
# suite and its package list (reruns with the same inputs only print the path):
#   root.img      ext4 root filesystem (mke2fs -d, no loop mount), booted as /dev/vda
#   vmlinuz       the guest kernel (linux-image-cloud-amd64) for qemu -kernel
#   initrd.img    its initramfs for qemu -initrd
#   cmdline       the kernel command line
#   packages.txt  dpkg -l of the guest (what was tested)
#   timings.txt   seconds per phase of the build (debootstrap, apt, configure, mke2fs)
# The tree is built on a tmpfs when the machine has memory to spare: dpkg's fsyncs on a disk
# that cargo builds write to were most of a cold build's time.
# The last line of stdout is the cache directory: $VM_CACHE_DIR (default
# /var/cache/agent-sandbox/vm)/SUITE/KEY; a new key replaces the suite's older image.
#
# Usage: hack/vm/image.sh [--suite bookworm|trixie|sid]   (default: $VM_SUITE, else bookworm)
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { echo "vm/image.sh: $*" >&2; exit 1; }

suite=${VM_SUITE:-bookworm}
while (($#)); do
    case $1 in
    --suite) suite=${2:?--suite needs bookworm, trixie or sid}; shift 2 ;;
    -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ $(id -u) == 0 ]] || die "run as root (debootstrap and chroot)"
for tool in debootstrap mke2fs chroot sha256sum; do
    command -v "$tool" >/dev/null || die "$tool is missing (hack/install-deps.sh)"
done

# What the checks need, all from Debian: the kernel users' cloud VMs boot (AppArmor
# built in, no 9p), systemd as init with logind and the user D-Bus session (rootless podman
# with cgroup_manager=systemd), udev (device units for the exchange disk), the container
# stack of hack/install-deps.sh with crun beside runc (both are the suite's references), and
# the tools checks.sh calls (git: the agent task's checkout is made and its promoted history
# read by its owner, as on a desktop).
packages=(
    linux-image-cloud-amd64 initramfs-tools
    systemd-sysv udev dbus dbus-user-session libpam-systemd systemd-container
    podman containerd runc crun conmon catatonit uidmap slirp4netns fuse-overlayfs
    containernetworking-plugins golang-github-containers-common
    apparmor libseccomp2
    iproute2 e2fsprogs jq procps util-linux kmod
    git
)
case $suite in
bookworm) ;;
trixie | sid)
    # podman 5 networks with netavark (which runs nft) and, rootless, pasta: without them
    # every runtime fails ("unable to execute nft", "could not find pasta"). APT would only
    # recommend them, and the guest installs no recommends.
    packages+=(netavark aardvark-dns nftables passt)
    # Checkpoint/restore (podman container checkpoint|restore): CRIU 4, which these suites
    # package (bookworm's 3.17 is not what users of 2026 run, and bookworm-backports has none),
    # and the iptables-restore it runs to lock the network while it dumps (criu only suggests
    # iptables; without it sid's checkpoint fails: `execvp("iptables-restore") failed`).
    packages+=(criu iptables)
    ;;
*) die "unknown suite $suite (bookworm, trixie, sid)" ;;
esac
cache_root=${VM_CACHE_DIR:-/var/cache/agent-sandbox/vm}

# The Debian mirror (and security mirror) of this machine's apt configuration, read at
# run time: one-line sources.list entries and deb822 .sources files.
apt_uris() {
    local want=$1 f
    shopt -s nullglob
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f $f ]] || continue
        awk -v want="$want" '$1 == "deb" {
            i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
            if ($(i + 1) == want) print $i }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        awk -v want="$want" '
            /^[[:space:]]*$/ { if (deb && ok) print uri; deb = 0; ok = 0; uri = ""; next }
            tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
            tolower($1) == "uris:" { uri = $2 }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == want) ok = 1 }
            END { if (deb && ok) print uri }' "$f"
    done
}
# The machine's own entry for the suite, else its bookworm entry's mirror (the machine is
# Debian 12; the same mirror serves trixie and sid). sid has no security suite.
mirror=$(apt_uris "$suite" | head -n1)
[[ -n $mirror ]] || mirror=$(apt_uris bookworm | head -n1)
security=$(apt_uris "$suite-security" | head -n1)
[[ -n $security || $suite == sid ]] || security=$(apt_uris bookworm-security | head -n1)
[[ -n $mirror ]] || die "no 'deb' source for suite $suite or bookworm in /etc/apt/sources.list{,.d}: cannot pick a mirror"

key=$(
    {
        sha256sum hack/vm/image.sh hack/vm/guest/* | awk '{print $1}'
        printf '%s\n' "${packages[@]}" "$suite" "$mirror" "$security"
    } | sha256sum | cut -c1-16
)
out=$cache_root/$suite/$key
if [[ -f $out/root.img && -f $out/vmlinuz && -f $out/initrd.img && -f $out/cmdline ]]; then
    echo "vm/image.sh: guest image is up to date ($out)" >&2
    echo "$out"
    exit 0
fi

start=$SECONDS
install -d -m 0755 "$cache_root/$suite"
work=$cache_root/$suite/build.$key
rootfs=$work/rootfs
mounted=()
cleanup() {
    local m
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        m=${mounted[i]}
        umount -l "$m" 2>/dev/null || true
    done
}
# A build killed before its clean-up leaves its mounts; the host's /dev among them must not
# be emptied by the rm below.
unmount_below() {
    local m
    findmnt -rn -o TARGET | awk -v top="$1" '$0 == top || index($0, top "/") == 1' | sort -r |
        while read -r m; do umount -l "$m" || true; done
}
trap 'cleanup; unmount_below "$rootfs"' EXIT
unmount_below "$work"
rm -rf --one-file-system "$work"
install -d -m 0755 "$rootfs"
# The tree is built in memory where the machine has it to spare (about 1 GB per guest;
# dpkg's fsyncs cost nothing on a tmpfs), else on the cache's disk.
avail_kib=$(awk '$1 == "MemAvailable:" { print $2 }' /proc/meminfo)
if ((avail_kib > 6 * 1024 * 1024)) && mount -t tmpfs -o size=4g,mode=0755 vm-rootfs "$rootfs"; then
    echo "vm/image.sh: building the tree on a tmpfs" >&2
fi
# Where the build's time goes, one line per phase (seconds), kept beside the image.
phase_start=$SECONDS
phase() {
    printf '%-12s %4d s\n' "$1" $((SECONDS - phase_start)) >>"$work/timings.txt"
    phase_start=$SECONDS
}

echo "vm/image.sh: debootstrap $suite from $mirror into $rootfs" >&2
nice debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    die "debootstrap failed; see $work/debootstrap.log"
phase debootstrap

{
    echo "deb $mirror $suite main"
    [[ $suite == sid ]] || echo "deb $mirror $suite-updates main"
    [[ -z $security ]] || echo "deb $security $suite-security main"
} >"$rootfs/etc/apt/sources.list"
# The mirror is a snapshot: sid's Release file is already past its Valid-Until, and the
# other suites' will be within days of a snapshot.
echo 'Acquire::Check-Valid-Until "false";' >"$rootfs/etc/apt/apt.conf.d/99snapshot-mirror"
# Package scripts must not start daemons in the chroot (exit 101 = action forbidden).
printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
# dpkg without an fsync per file: the tree becomes an image file at the end, and a crash
# before that only means a rebuild. No documentation, manual pages or translations: nothing
# in the guest reads them, and leaving them out saves unpacking and the image's bytes. (Each
# package's copyright file stays.)
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/90vm-image" <<'CFG'
force-unsafe-io
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
CFG
for fs in proc sys dev; do
    case $fs in
    proc) mount -t proc proc "$rootfs/proc" ;;
    sys) mount -t sysfs sysfs "$rootfs/sys" ;;
    dev) mount --bind /dev "$rootfs/dev" ;;
    esac
    mounted+=("$rootfs/$fs")
done
in_root() { chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
apt_opts=(-o APT::Install-Recommends=false -y -q)
echo "vm/image.sh: apt-get install ${#packages[@]} packages in the guest" >&2
in_root apt-get "${apt_opts[@]}" update >"$work/apt.log" 2>&1 ||
    die "apt-get update in the guest failed; see $work/apt.log"
phase apt-update
{
    nice chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        apt-get "${apt_opts[@]}" install "${packages[@]}"
    in_root apt-get clean
} >>"$work/apt.log" 2>&1 || die "apt-get in the guest failed; see $work/apt.log"
phase apt-install
# AppArmor's cache, compiled here rather than at every boot: apparmor.service compiles every
# profile in /etc/apparmor.d unless /var/cache/apparmor holds them for the running kernel's
# features (sid's AppArmor 5 ships 143 profiles: 21 s of each boot under TCG). This chroot
# cannot read the guest kernel's features, so they come from a boot of the suite's guest
# (the file the parser keeps in its cache, copied to out/apparmor.features by
# hack/vm/checks.sh), kept as hack/vm/guest/apparmor-features.SUITE. A kernel with other
# features only misses the cache and compiles at boot as before.
aa_features=hack/vm/guest/apparmor-features.$suite
if [[ -f $aa_features ]]; then
    install -m 0644 "$aa_features" "$rootfs/tmp/kernel-features"
    in_root apparmor_parser --kernel-features /tmp/kernel-features --skip-kernel-load \
        --write-cache --cache-loc /var/cache/apparmor --quiet /etc/apparmor.d >"$work/apparmor.log" 2>&1 ||
        die "apparmor_parser could not compile the guest's profiles; see $work/apparmor.log"
    rm -f "$rootfs/tmp/kernel-features"
    phase apparmor
fi
cleanup
mounted=()
rm -f "$rootfs/usr/sbin/policy-rc.d" "$rootfs/etc/dpkg/dpkg.cfg.d/90vm-image"

echo "vm/image.sh: configuring the guest" >&2
echo vm >"$rootfs/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 vm\n' >"$rootfs/etc/hosts"
# The root disk is a throw-away snapshot (qemu snapshot=on): no fsck.
echo '/dev/vda / ext4 rw,noatime 0 0' >"$rootfs/etc/fstab"
# The check runner and its unit (hack/vm/guest): the checks themselves come on the exchange
# disk, so changing them needs no new image.
install -m 0755 hack/vm/guest/vm-checks "$rootfs/usr/local/sbin/vm-checks"
install -m 0644 hack/vm/guest/vm-checks.service "$rootfs/etc/systemd/system/vm-checks.service"
ln -sf /etc/systemd/system/vm-checks.service "$rootfs/etc/systemd/system/multi-user.target.wants/vm-checks.service"
# Nothing that runs on a timer or waits for a login on the console: the guest lives a few
# minutes and its console is the suite's log.
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
    fstrim.timer logrotate.timer man-db.timer dpkg-db-backup.timer getty@tty1.service \
    serial-getty@ttyS0.service systemd-timesyncd.service; do
    ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
# The rootless test user of the project's conventions (ARCHITECTURE.md), with subordinate ids,
# and a desktop's first user (uid 1000), whose own checkout the agent task edits.
chroot "$rootfs" useradd --uid 1500 --create-home --shell /bin/bash agentci
chroot "$rootfs" useradd --uid 1000 --create-home --shell /bin/bash dev
printf '%s\n' agentci:200000:65536 dev:300000:65536 >"$rootfs/etc/subuid"
printf '%s\n' agentci:200000:65536 dev:300000:65536 >"$rootfs/etc/subgid"
chroot "$rootfs" dpkg -l >"$work/packages.txt"

kernel=$(find "$rootfs/boot" -maxdepth 1 -name 'vmlinuz-*' | sort | tail -n1)
initrd=$(find "$rootfs/boot" -maxdepth 1 -name 'initrd.img-*' | sort | tail -n1)
[[ -n $kernel && -n $initrd ]] || die "no kernel or initrd in $rootfs/boot"
cp "$kernel" "$work/vmlinuz"
cp "$initrd" "$work/initrd.img"
echo 'root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 apparmor=1 security=apparmor quiet' >"$work/cmdline"

# Room for container images and storage beside the installed system (a sparse file).
used_mb=$(du -sm "$rootfs" | cut -f1)
size_mb=$((used_mb + 3072))
phase configure
mke2fs -F -q -t ext4 -L vmroot -d "$rootfs" "$work/root.img" "${size_mb}M" >"$work/mke2fs.log" 2>&1 ||
    die "mke2fs -d of $rootfs failed; see $work/mke2fs.log"
unmount_below "$rootfs"
rm -rf --one-file-system "$rootfs"
phase mke2fs

# Publish: replace an older image of any key.
rm -rf "$out"
mv "$work" "$out"
find "$cache_root/$suite" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf --one-file-system {} +
# Images of the layout before suites (KEY directly under the cache root).
find "$cache_root" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended \
    -regex '.*/[0-9a-f]{16}|.*/build\.[0-9a-f]{16}' -exec rm -rf --one-file-system {} +
echo "vm/image.sh: built the $suite guest $out ($((SECONDS - start)) s, root filesystem $used_mb MB)" >&2
echo "$out"
