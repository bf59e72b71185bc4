# Shell functions for building a busybox initramfs around a Debian kernel, sourced by
# scripts/vm/build-guest.sh (the test guest) and bench/vm.sh (the benchmark guest).

# busybox_into TREE: busybox and a link per applet in TREE/bin, modprobe in TREE/sbin.
busybox_into() {
    cp /bin/busybox "$1/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$1/bin/$applet"
    done
    ln -sf ../bin/busybox "$1/sbin/modprobe"
}

# modules_into TREE KVER MODULES...: the modules and what they depend on, as modprobe
# resolves them for kernel KVER (built-in ones have no file and are skipped), uncompressed,
# with the index depmod makes for them.
modules_into() {
    local tree=$1 kver=$2 md ko rel
    shift 2
    md=/lib/modules/$kver
    for m in "$@"; do
        modprobe -S "$kver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
    done | sort -u | while read -r ko; do
        rel=${ko#"$md"/}
        mkdir -p "$tree/$md/$(dirname "$rel")"
        case $ko in
            *.xz) xz -dc "$ko" >"$tree/$md/${rel%.xz}" ;;
            *.zst) zstd -qdc "$ko" >"$tree/$md/${rel%.zst}" ;;
            *) cp "$ko" "$tree/$md/$rel" ;;
        esac
    done
    cp "$md"/modules.order "$md"/modules.builtin* "$tree/$md/" 2>/dev/null || true
    depmod -b "$tree" "$kver"
}
