#!/usr/bin/env bash
# Builds the test images locally from bundles/ (no registry): a rootfs directory
# per image, one deterministic layer, packed with umoci into an OCI archive at
# /var/cache/agent-sandbox/images/NAME.tar, then loaded into podman for root and
# for the rootless test user as localhost/agent-sandbox/NAME:latest, and, when
# containerd is running, imported into its namespaces default and k8s.io (the CRI's).
#
# A recipe with scratch=1 (bundles/pause) gets no base rootfs, busybox or probe:
# only the binaries it compiles from C sources (static_c) and its entrypoint.
#
# An image is rebuilt only when its inputs change: the recipe, the base rootfs,
# this script, the probe binary and the versions of the Debian packages it copies.
# The hash of those inputs is the image label org.agent-sandbox.inputs, so a load
# is skipped when the store already holds an image with the same label.
#
# Usage: hack/images.sh PROBE_BINARY [NAME...]   (default: every bundles/*/image.conf)
set -euo pipefail
cd "$(dirname "$0")/.."

probe=${1:?usage: hack/images.sh PROBE_BINARY [NAME...]}
shift
[[ -x $probe ]] || { echo "images.sh: probe binary $probe is missing or not executable" >&2; exit 1; }
if ! file -b "$probe" 2>/dev/null | grep -q 'static'; then
    if ldd "$probe" >/dev/null 2>&1; then
        echo "images.sh: $probe is dynamically linked; build it with -C target-feature=+crt-static" >&2
        exit 1
    fi
fi

out=/var/cache/agent-sandbox/images
work=/var/cache/agent-sandbox/build
test_user=agentci
install -d -m 0755 "$out" "$work"

names=("$@")
if ((${#names[@]} == 0)); then
    for conf in bundles/*/image.conf; do names+=("$(basename "$(dirname "$conf")")"); done
fi

# Fixed timestamps make the layer, and so the image digest, depend on content only.
epoch=1700000000
created=2023-11-14T22:13:20Z

# Prints the inputs of image $1 for hashing. An image that copies Debian packages
# also depends on the libraries ldd finds, so it hashes every installed package's
# version (a security update anywhere rebuilds it, which is what we want).
inputs() {
    local name=$1
    local c
    if ((scratch)); then
        # Only its own sources: a new probe or busybox does not touch a scratch image.
        sha256sum hack/images.sh "bundles/$name/image.conf" | awk '{print $1}'
        for c in "${static_c[@]}"; do sha256sum "bundles/$name/${c%%:*}"; done
        cc --version | head -n1
        return
    fi
    sha256sum hack/images.sh "bundles/$name/image.conf" "$probe" /bin/busybox | awk '{print $1}'
    (cd bundles/base/rootfs && find . -type f -print0 | sort -z | xargs -0 sha256sum)
    if ((${#packages[@]} + ${#extra_files[@]})); then
        dpkg-query -W
        for f in "${extra_files[@]}"; do sha256sum "$f"; done
    fi
}

# Copies the files of Debian packages, keeping symlinks, with /bin, /lib, ...
# folded into /usr as in Debian's merged-/usr layout.
copy_packages() {
    local rootfs=$1 list
    list=$(mktemp)
    for p in "${packages[@]}"; do
        dpkg -L "$p" >/dev/null || { echo "images.sh: package $p is not installed (hack/install-deps.sh)" >&2; exit 1; }
        dpkg -L "$p"
    done | sort -u | while read -r path; do
        [[ -d $path && ! -L $path ]] && continue
        # The merged-/usr links themselves (a package listing /bin): folding handles them.
        case $path in /bin | /sbin | /lib | /lib32 | /lib64 | /libx32) continue ;; esac
        [[ -e $path || -L $path ]] || continue
        if [[ -n ${exclude_regex:-} && $path =~ $exclude_regex ]]; then continue; fi
        printf '%s\n' "${path#/}"
    done >"$list"
    tar -C / --no-recursion -cf - -T "$list" | tar -C "$rootfs/usr-fold" -xf -
    rm -f "$list"
}

# Copies the shared libraries of every dynamically linked executable and shared
# object in the rootfs. ldd prints the whole closure, so one pass suffices.
copy_libraries() {
    local rootfs=$1 missing lib dest f
    local -A seen=()
    while IFS= read -r -d '' f; do
        file -b "$f" | grep -q 'ELF.*dynamically linked' || continue
        missing=$(ldd "$f" 2>&1 | grep 'not found' || true)
        if [[ -n $missing ]]; then
            echo "images.sh: $f needs libraries this host lacks: $missing" >&2
            exit 1
        fi
        while read -r lib; do
            [[ -n $lib && -z ${seen[$lib]:-} ]] || continue
            seen[$lib]=1
            dest="$rootfs/usr${lib#/usr}"
            [[ -e $dest ]] || install -D -m 0755 "$(readlink -f "$lib")" "$dest"
        done < <(ldd "$f" | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}')
    done < <(find "$rootfs/usr" -type f \( -perm -u+x -o -name '*.so*' \) -print0)
}

# The rootfs of a scratch recipe: its static_c binaries and nothing else (no shell,
# no libraries: they are static).
build_scratch_rootfs() {
    local name=$1 rootfs=$2 c
    rm -rf "$rootfs"
    install -d -m 0755 "$rootfs"/{proc,sys,dev,etc}
    for c in "${static_c[@]}"; do
        install -d -m 0755 "$rootfs$(dirname "${c#*:}")"
        cc -static -Os -s -Wall -Wextra -Werror -o "$rootfs${c#*:}" "bundles/$name/${c%%:*}"
        chmod 0755 "$rootfs${c#*:}"
    done
    chown -R 0:0 "$rootfs"
}

build_rootfs() {
    local name=$1 rootfs=$2
    if ((scratch)); then
        build_scratch_rootfs "$name" "$rootfs"
        return
    fi
    rm -rf "$rootfs"
    install -d -m 0755 "$rootfs"/usr/{bin,sbin,lib,lib64,local/bin} "$rootfs"/{proc,sys,dev,run,mnt,workspace}
    install -d -m 1777 "$rootfs/tmp"
    for d in bin sbin lib lib64; do ln -s "usr/$d" "$rootfs/$d"; done
    cp -a bundles/base/rootfs/. "$rootfs/"
    chown -R 0:0 "$rootfs"
    chmod 0700 "$rootfs/root"
    chown -R 1000:1000 "$rootfs/home/agent"
    chmod 0700 "$rootfs/home/agent/.ssh"
    chmod 0600 "$rootfs/home/agent/.ssh/id_rsa"

    # Debian packages, folded into /usr.
    if ((${#packages[@]})); then
        mkdir "$rootfs/usr-fold"
        copy_packages "$rootfs"
        local top
        for top in "$rootfs"/usr-fold/*; do
            case ${top##*/} in
            bin | sbin | lib | lib64) cp -a "$top/." "$rootfs/usr/${top##*/}/" ;;
            *) cp -a "$top" "$rootfs/" ;;
            esac
        done
        rm -rf "$rootfs/usr-fold"
    fi
    for f in "${extra_files[@]}"; do
        [[ -e $f ]] || { echo "images.sh: $f is missing on this host" >&2; exit 1; }
        install -D -m 0644 "$f" "$rootfs$f"
    done
    for l in "${links[@]}"; do ln -sfn "${l#*:}" "$rootfs/${l%%:*}"; done
    copy_libraries "$rootfs"

    # busybox and its applets, without shadowing real tools.
    install -m 0755 /bin/busybox "$rootfs/usr/bin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do
        [[ -e $rootfs/usr/bin/$applet || -L $rootfs/usr/bin/$applet ]] || ln -s busybox "$rootfs/usr/bin/$applet"
    done
    install -m 0755 "$probe" "$rootfs/usr/local/bin/probe"
}

pack() {
    local name=$1 rootfs=$2 hash=$3 layout=$work/$name.oci
    local ref=localhost/agent-sandbox/$name:latest
    rm -rf "$layout" "$work/$name.layer.tar"
    tar -C "$rootfs" --sort=name --numeric-owner --mtime="@$epoch" --xattrs -cf "$work/$name.layer.tar" .
    umoci init --layout "$layout"
    umoci new --image "$layout:latest"
    umoci raw add-layer --image "$layout:latest" \
        --history.created "$created" --history.created_by "hack/images.sh $name" \
        "$work/$name.layer.tar"
    local run=(--config.cmd /bin/sh)
    [[ -n $entrypoint ]] && run=(--config.entrypoint "$entrypoint")
    umoci config --no-history --image "$layout:latest" --created "$created" \
        --config.env PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
        "${run[@]}" --config.workingdir / \
        --config.label "org.agent-sandbox.inputs=$hash" \
        --config.label "org.agent-sandbox.image=$name"
    umoci gc --layout "$layout"
    # Full names in the index so `podman load` and `ctr image import` need no renaming.
    jq --arg ref "$ref" '.manifests |= map(.annotations = {"org.opencontainers.image.ref.name": $ref, "io.containerd.image.name": $ref})' \
        "$layout/index.json" >"$layout/index.json.new"
    mv "$layout/index.json.new" "$layout/index.json"
    tar -C "$layout" --sort=name --numeric-owner --mtime="@$epoch" -cf "$out/$name.tar.new" .
    chmod 0644 "$out/$name.tar.new"
    mv "$out/$name.tar.new" "$out/$name.tar"
    echo "$hash" >"$out/$name.inputs"
    rm -rf "$layout" "$work/$name.layer.tar"
}

# Loads $1's archive into the podman store of the calling user unless the store
# already has it with the same input hash. $2.. prefixes the podman command.
load() {
    local name=$1 hash=$2
    shift 2
    local ref=localhost/agent-sandbox/$name:latest have
    have=$("$@" podman image inspect --format '{{index .Labels "org.agent-sandbox.inputs"}}' "$ref" 2>/dev/null || true)
    [[ $have == "$hash" ]] && return 0
    "$@" podman load --quiet -i "$out/$name.tar" >/dev/null
    # podman names an oci-archive image after its ref annotation; tag it anyway
    # in case this podman does not, and fail if the result lacks the label.
    local id
    id=$("$@" podman image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)
    if [[ -z $id ]]; then
        echo "images.sh: podman load of $out/$name.tar did not create $ref" >&2
        exit 1
    fi
    have=$("$@" podman image inspect --format '{{index .Labels "org.agent-sandbox.inputs"}}' "$ref")
    [[ $have == "$hash" ]] || { echo "images.sh: $ref has inputs $have after load, expected $hash" >&2; exit 1; }
}

# Imports $1's archive into containerd's namespaces default and k8s.io (the CRI's)
# unless the image there already carries the same input hash as a containerd label.
# Does nothing when containerd is not running (hack/containerd.sh imports at start).
socket=/run/containerd/containerd.sock
import_containerd() {
    local name=$1 hash=$2 ns ref=localhost/agent-sandbox/$name:latest
    command -v ctr >/dev/null && ctr --address "$socket" version >/dev/null 2>&1 || return 0
    for ns in default k8s.io; do
        if [[ -n $(ctr --address "$socket" -n "$ns" images ls -q "name==$ref,labels.\"org.agent-sandbox.inputs\"==$hash") ]]; then
            continue
        fi
        ctr --address "$socket" -n "$ns" images import --all-platforms "$out/$name.tar" >/dev/null
        ctr --address "$socket" -n "$ns" images label "$ref" "org.agent-sandbox.inputs=$hash" >/dev/null
    done
}

as_test_user=(runuser -u "$test_user" -- env XDG_RUNTIME_DIR=/run/user/1500 HOME=/home/$test_user)

for name in "${names[@]}"; do
    conf=bundles/$name/image.conf
    [[ -f $conf ]] || { echo "images.sh: no recipe $conf" >&2; exit 1; }
    packages=() extra_files=() links=() exclude_regex='' scratch=0 static_c=() entrypoint=''
    # shellcheck source=/dev/null
    source "$conf"
    hash=$(inputs "$name" | sha256sum | cut -c1-32)
    if [[ -f $out/$name.tar && $(cat "$out/$name.inputs" 2>/dev/null) == "$hash" ]]; then
        echo "images.sh: $name is up to date ($hash)"
    else
        start=$SECONDS
        build_rootfs "$name" "$work/$name.rootfs"
        pack "$name" "$work/$name.rootfs" "$hash"
        rm -rf "$work/$name.rootfs"
        echo "images.sh: built $out/$name.tar ($(du -h "$out/$name.tar" | cut -f1), $((SECONDS - start)) s)"
    fi
    load "$name" "$hash"
    # From /: the test user may not be able to enter this checkout.
    (cd / && load "$name" "$hash" "${as_test_user[@]}")
    import_containerd "$name" "$hash"
done
