#!/usr/bin/env bash
# Build the local Redis image used by lockwright-chaos, once per machine.
#
# The image is `FROM scratch` and holds only:
#   - redis-server compiled from Debian's source package with MALLOC=libc
#     (Debian's binary links jemalloc, which hangs under libfaketime),
#   - the shared libraries it and libfaketime need (libc, libm, ld-linux),
#     copied at their real paths,
#   - libfaketime (Debian package libfaketime),
#   - an empty /data (working directory, AOF) and /faketime (bind mount point).
#
# No registry is needed: nothing is pulled. Idempotent: it does nothing when
# the image and the compiled binary already exist (FORCE=1 rebuilds it); the
# binary is kept under $LOCKWRIGHT_CACHE (default
# ~/.cache/lockwright/redis-faketime) as redis-server-<version>-libc, linked
# as redis-server-libc, where the conformance test
# (tests/tests/conformance.rs) runs it on the host under libfaketime with a
# frozen clock.
#
# Environment:
#   LOCKWRIGHT_REDIS_IMAGE  image tag (default lockwright/redis-faketime:7)
#   LOCKWRIGHT_CACHE        cache directory
#   FORCE=1                 rebuild the image even if the tag exists
#   FORCE_COMPILE=1         also recompile redis-server
set -euo pipefail

IMAGE="${LOCKWRIGHT_REDIS_IMAGE:-lockwright/redis-faketime:7}"
CACHE="${LOCKWRIGHT_CACHE:-${HOME}/.cache/lockwright/redis-faketime}"
JOBS="${JOBS:-2}"
SRC_LIST=/etc/apt/sources.list.d/lockwright-deb-src.sources
START=$(date +%s)

say() { printf '[build-redis-image %3ss] %s\n' "$(( $(date +%s) - START ))" "$*"; }
die() { say "ERROR: $*" >&2; exit 1; }

# Docker is needed for the image, not for the host binary: without it the
# binary is still compiled (the conformance test runs it), then the script
# stops before the image.
docker_ok=1
{ command -v docker >/dev/null && docker info >/dev/null 2>&1; } || docker_ok=0

if [[ "${FORCE:-0}" != 1 && $docker_ok == 1 && -x "$CACHE/redis-server-libc" ]] \
    && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "image $IMAGE and $CACHE/redis-server-libc already exist (FORCE=1 rebuilds them); nothing to do"
    exit 0
fi


# --- 1. Debian source package of redis -------------------------------------
have_deb_src() {
    grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/
}

# The source entries mirror the machine's own binary entries (same URIs,
# suites and keys, Types deb-src): this script names no archive itself.
derive_deb_src() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -e "$f" && "$f" != "$SRC_LIST" ]] || continue
        awk 'BEGIN { RS = ""; ORS = "\n\n" }
             {
                 n = split($0, lines, "\n"); out = ""; binary = 0
                 for (i = 1; i <= n; i++) {
                     line = lines[i]
                     if (line ~ /^Types:/) {
                         if (line ~ /[: ]deb( |$)/) binary = 1
                         line = "Types: deb-src"
                     }
                     out = out line "\n"
                 }
                 if (binary) printf "%s\n", out
             }' "$f"
    done
}
derive_deb_src_lines() {
    grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | sed 's/^deb /deb-src /'
}

if ! have_deb_src; then
    [[ $(id -u) == 0 ]] || die "no deb-src entry in /etc/apt and not root: add one for the redis source package"
    stanzas="$(derive_deb_src)"
    lines="$(derive_deb_src_lines || true)"
    [[ -n "$stanzas$lines" ]] || die "no binary apt source to derive a deb-src entry from"
    say "adding deb-src entries mirroring this machine's apt sources"
    [[ -z "$stanzas" ]] || printf '%s\n' "$stanzas" > "$SRC_LIST"
    [[ -z "$lines" ]] || printf '%s\n' "$lines" > "${SRC_LIST%.sources}.list"
fi
# `.ci/run` adds the source entry first so that one `apt-get update` serves all.
[[ "${1:-}" == --add-sources-only ]] && exit 0
mkdir -p "$CACHE"
cd "$CACHE"
if ! grep -q '^Package: redis' <(apt-cache showsrc redis 2>/dev/null); then
    say "apt-get update (source indexes)"
    apt-get update -qq || die "apt-get update failed"
fi

REDIS_VERSION="$(apt-cache showsrc redis | awk '/^Version:/ {print $2}' | sort -V | tail -1)"
UPSTREAM="${REDIS_VERSION#*:}"
UPSTREAM="${UPSTREAM%-*}"
BIN="$CACHE/redis-server-$UPSTREAM-libc"
say "Debian source redis $REDIS_VERSION (upstream $UPSTREAM)"

if [[ "${FORCE_COMPILE:-0}" == 1 || ! -x "$BIN" ]]; then
    mkdir -p src
    (
        cd src
        if ! ls redis_"$UPSTREAM".orig.tar.* >/dev/null 2>&1; then
            say "apt-get source --download-only redis"
            apt-get source -qq -o APT::Sandbox::User=root --download-only redis || die "apt-get source failed"
        fi
        ORIG="$(ls redis_"$UPSTREAM".orig.tar.* | head -1)"
        rm -rf build && mkdir build
        tar -xf "$ORIG" -C build --strip-components=1
        say "make MALLOC=libc BUILD_TLS=no -j$JOBS (about 30-60 s)"
        make -C build -s MALLOC=libc BUILD_TLS=no -j"$JOBS" >make.log 2>&1 \
            || { tail -30 make.log; die "make failed (log: $CACHE/src/make.log)"; }
        cp build/src/redis-server "$BIN.tmp"
        strip "$BIN.tmp"
        mv "$BIN.tmp" "$BIN"
    )
    say "compiled $BIN"
else
    say "using cached $BIN"
fi
"$BIN" --version
# A stable name for the host's tests (tests/src/lib.rs, find_redis_server_libc).
ln -sfn "$(basename "$BIN")" "$CACHE/redis-server-libc"
say "linked $CACHE/redis-server-libc -> $(basename "$BIN")"
if [[ $docker_ok != 1 ]]; then
    die "docker CLI not found or Docker daemon not reachable: the host binary is built, the image is not"
fi

# --- 2. libfaketime from the Debian binary package --------------------------
FAKETIME_LIB=usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
if [[ ! -f "$CACHE/faketime/$FAKETIME_LIB" ]]; then
    say "apt-get download libfaketime"
    rm -rf faketime-deb faketime && mkdir faketime-deb
    (cd faketime-deb && apt-get download -qq -o APT::Sandbox::User=root libfaketime) || die "apt-get download libfaketime failed"
    dpkg-deb -x faketime-deb/libfaketime_*.deb faketime
fi
[[ -f "$CACHE/faketime/$FAKETIME_LIB" ]] || die "libfaketime.so.1 missing after extraction"

# --- 3. root file system ------------------------------------------------------
say "assembling the root file system"
ROOTFS="$CACHE/rootfs"
rm -rf "$ROOTFS" && mkdir -p "$ROOTFS/usr/local/bin" "$ROOTFS/data" "$ROOTFS/faketime" \
    "$ROOTFS/tmp" "$ROOTFS/$(dirname "$FAKETIME_LIB")"
cp "$BIN" "$ROOTFS/usr/local/bin/redis-server"
cp "$CACHE/faketime/$FAKETIME_LIB" "$ROOTFS/$FAKETIME_LIB"

copy_real() { # copy a library at its real path, and its interpreter path as a symlink
    local real
    real="$(readlink -f "$1")"
    if [[ ! -e "$ROOTFS$real" ]]; then
        mkdir -p "$ROOTFS$(dirname "$real")"
        cp "$real" "$ROOTFS$real"
    fi
    # The name the loader asks for (soname) next to the real file.
    local named
    named="$(dirname "$real")/$(basename "$1")"
    [[ "$named" == "$real" || -e "$ROOTFS$named" ]] || ln -s "$(basename "$real")" "$ROOTFS$named"
    echo "$real"
}
for elf in "$BIN" "$CACHE/faketime/$FAKETIME_LIB"; do
    while read -r lib; do
        say "  $(basename "$elf") needs $lib -> $(copy_real "$lib")"
    done < <(ldd "$elf" | grep -oE '/[^ ]+' | sort -u)
done
# The ELF interpreter path (/lib64/ld-linux-x86-64.so.2) must exist as such.
INTERP="$(readelf -l "$BIN" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')"
if [[ -n "$INTERP" && ! -e "$ROOTFS$INTERP" ]]; then
    mkdir -p "$ROOTFS$(dirname "$INTERP")"
    ln -s "$(readlink -f "$INTERP")" "$ROOTFS$INTERP"
fi
chmod 1777 "$ROOTFS/tmp"

cat > "$CACHE/Dockerfile" <<'EOF'
FROM scratch
COPY rootfs/ /
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/redis-server"]
CMD ["--protected-mode", "no", "--save", "", "--appendonly", "no"]
EOF
printf 'faketime-deb\nfaketime\nsrc\nredis-server-*\n' > "$CACHE/.dockerignore"

# --- 4. docker build ---------------------------------------------------------
say "docker build -t $IMAGE"
docker build -q -t "$IMAGE" \
    --label org.lockwright.redis-version="$UPSTREAM" \
    --label org.lockwright.malloc=libc "$CACHE" >"$CACHE/docker-build.log" 2>&1 \
    || { cat "$CACHE/docker-build.log"; die "docker build failed"; }

say "smoke test: redis-server --version inside the image"
docker run --rm "$IMAGE" --version
say "done: $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
