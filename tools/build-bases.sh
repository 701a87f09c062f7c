#!/usr/bin/env bash
# The two base images of `make image BASES=debian`, made from Debian packages so that no
# container registry is needed (the way distroless images are made):
#
#   build base    Debian 12 minbase with python3, python3-venv, make, and gcc with
#                 Python's headers for the compiled build (setup.py)
#   runtime base  only Python 3.11's runtime files and the shared libraries it and the
#                 wheels load, CA certificates and the nonroot user (65532): no shell,
#                 package manager, dpkg or perl
#
# Both hold the same /usr/bin/python3.11, which the venv copied between stages links to.
#
#   tools/build-bases.sh ENGINE BUILD_TAG RUNTIME_TAG
#
# Does nothing when both tags exist: the Makefile puts a hash of this file in the tags, so
# a changed recipe builds new bases. DEBIAN_MIRROR names a mirror (air-gapped sites).
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 ENGINE BUILD_TAG RUNTIME_TAG" >&2
  exit 2
fi
engine=$1 build_tag=$2 runtime_tag=$3
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if "$engine" image inspect "$build_tag" >/dev/null 2>&1 &&
  "$engine" image inspect "$runtime_tag" >/dev/null 2>&1; then
  exit 0
fi
fail() {
  echo "build-bases: $*" >&2
  exit 1
}
command -v debootstrap >/dev/null ||
  fail "debootstrap is not installed (apt-get install debootstrap), or use BASES=pull"
[ "$(id -u)" = 0 ] || fail "debootstrap needs root, or use BASES=pull"

# What python3.11 and the wheels (grpcio, protobuf, cryptography, orjson) link against,
# as ldd lists it; modules needing anything else are removed below.
RUNTIME_PACKAGES=(
  libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5
  libuuid1 libcrypt1 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib
)
UNLINKED_MODULES='_curses|_curses_panel|readline|_dbm|nis|_sqlite3'
ENV_PATH='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

work=$(mktemp -d "${TMPDIR:-/var/tmp}/plugproxy-bases.XXXXXX")
cleanup() {
  # A debootstrap stopped half-way can leave /proc or /sys mounted in the tree.
  awk -v w="$work/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m"; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
tree=$work/build runtime=$work/runtime

echo "build-bases: debootstrap bookworm from $mirror" >&2
if ! debootstrap --variant=minbase \
  --include=python3,python3-venv,make,ca-certificates,gcc,libc6-dev,python3-dev \
  bookworm "$tree" "$mirror" >"$work/debootstrap.log" 2>&1; then
  tail -n 5 "$work/debootstrap.log" >&2
  fail "debootstrap failed (full log above)"
fi

# Runtime base: the packages' files as dpkg lists them (merged /usr: /lib is usr/lib),
# with the bytecode their installation compiled, less documentation and iconv modules.
mkdir -p "$runtime"
for d in bin sbin lib lib64; do ln -s "usr/$d" "$runtime/$d"; done
chroot "$tree" dpkg-query -L "${RUNTIME_PACKAGES[@]}" |
  sed -E 's#^/(bin|sbin|lib|lib64)(/|$)#/usr/\1\2#; s#^/##' |
  grep -v -E '^(\.|usr/share(/.*)?|usr/lib/x86_64-linux-gnu/gconv(/.*)?|)$' |
  sort -u >"$work/files"
sed -n -E 's#^(usr/lib/python3\.11/(.*/)?)([^/]+)\.py$#\1__pycache__/\3.cpython-311.pyc#p' \
  "$work/files" | (cd "$tree" && xargs -r ls -d 2>/dev/null || true) >"$work/bytecode"
cat "$work/files" "$work/bytecode" |
  tar -C "$tree" --no-recursion --numeric-owner -T - -cf - | tar -C "$runtime" -xf -
find "$runtime/usr/lib/python3.11/lib-dynload" -regextype posix-extended \
  -regex ".*/($UNLINKED_MODULES)\.cpython-311-x86_64-linux-gnu\.so" -delete

mkdir -p "$runtime/etc/ssl/certs" "$runtime/var/lib/dpkg/status.d" "$runtime/home/nonroot"
cp "$tree/etc/ssl/certs/ca-certificates.crt" "$runtime/etc/ssl/certs/"
cp "$tree/usr/lib/os-release" "$runtime/usr/lib/os-release"
ln -s ../usr/lib/os-release "$runtime/etc/os-release"
# Package records where scanners look for them in distroless images.
for p in "${RUNTIME_PACKAGES[@]}"; do
  chroot "$tree" dpkg-query -s "$p" >"$runtime/var/lib/dpkg/status.d/$p"
done
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
  'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$runtime/etc/passwd"
printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$runtime/etc/group"
chown 65532:65532 "$runtime/home/nonroot"
chmod 700 "$runtime/home/nonroot"
install -d -m 1777 "$runtime/tmp"
echo 'include /etc/ld.so.conf.d/*.conf' >"$runtime/etc/ld.so.conf"
ldconfig -r "$runtime"
# Fails here, not in an image build, if a library the interpreter loads is missing.
chroot "$runtime" /usr/bin/python3.11 -c \
  'import asyncio, bz2, ctypes, decimal, hashlib, json, lzma, ssl, uuid, zlib, xml.parsers.expat'

# Build base: the whole tree, less the downloaded packages, indexes and documentation.
rm -rf "$tree"/var/cache/apt/archives/*.deb "$tree"/var/lib/apt/lists/* \
  "$tree"/usr/share/{doc,man,info,locale}/*

for pair in "$tree:$build_tag" "$runtime:$runtime_tag"; do
  dir=${pair%%:*} tag=${pair#*:}
  if ! out=$(tar -C "$dir" --numeric-owner -cf - . |
    "$engine" import --change "$ENV_PATH" \
      --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' - "$tag" 2>&1); then
    echo "$out" >&2
    fail "$engine import $tag failed"
  fi
  echo "build-bases: $tag ($(du -sh "$dir" | cut -f1))" >&2
done
