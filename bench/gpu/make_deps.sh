#!/usr/bin/env bash
# make_deps.sh -- the build dependencies the device machine's image may lack, gathered from
# this machine into one folder that the device tool can carry: OpenSSL's libcrypto (khor's
# one required library) and Criterion (the tests), headers, shared libraries and the
# libraries they load, and pkg-config itself. That image has CUDA, nvcc, CMake and NCCL but
# nothing can be installed there, and a configure that stops on a missing openssl/evp.h
# would spend the whole device run; device_check.sh uses the folder when it is there.
#
#   bash bench/gpu/make_deps.sh            # writes build-devdeps/ (ignored by /build*/)
#   run(carry=["build-devdeps"], command="bash bench/gpu/device_check.sh")
#
# The libraries are this machine's (Debian 12, glibc 2.36, x86-64); glibc itself is not
# copied, so they need an image with glibc 2.36 or newer. About 10 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.." || exit 1
D=${1:-build-devdeps}
MA=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
need() { [ -e "$1" ] || { echo "make_deps: $1 is missing here: apt-get install -y $2" >&2; exit 1; }; }
need /usr/include/openssl/evp.h libssl-dev
need /usr/include/criterion/criterion.h libcriterion-dev
need /usr/bin/pkgconf pkgconf

rm -rf "$D"
mkdir -p "$D/include" "$D/lib/pkgconfig" "$D/bin"
cp -a /usr/include/openssl "$D/include/"
# Debian keeps the configuration headers per architecture; the image's compiler won't look there.
[ -d "/usr/include/$MA/openssl" ] && cp -a "/usr/include/$MA/openssl/." "$D/include/openssl/"
cp -a /usr/include/criterion "$D/include/"

# A library and everything it loads but glibc, which the image has (and must be its own).
copy_closure() {
  local f
  for f in "$@"; do
    cp -L "$f" "$D/lib/"
    ldd "$f" | awk '/=> \// { print $3 }' | while read -r dep; do
      case $(basename "$dep") in
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libresolv.so.*) ;;
        *) [ -e "$D/lib/$(basename "$dep")" ] || cp -L "$dep" "$D/lib/" ;;
      esac
    done
  done
}
L=/usr/lib/$MA
copy_closure "$L/libcrypto.so.3" "$L/libssl.so.3" "$L/libcriterion.so.3" /usr/bin/pkgconf
# pkg-config finds its library through a wrapper, so that nothing else run there (cmake,
# nvcc, python) ever loads this machine's libraries: device_check.sh puts them on the
# binaries it builds by rpath, never on LD_LIBRARY_PATH.
mv "$D/lib/pkgconf" "$D/bin/pkgconf.bin"
cat > "$D/bin/pkg-config" <<'EOF2'
#!/bin/sh
d=$(dirname "$0")
LD_LIBRARY_PATH=$d/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$d/pkgconf.bin" "$@"
EOF2
chmod +x "$D/bin/pkg-config"
ln -sf libcrypto.so.3 "$D/lib/libcrypto.so"
ln -sf libssl.so.3 "$D/lib/libssl.so"
ln -sf libcriterion.so.3 "$D/lib/libcriterion.so"

# Criterion's own .pc names private requirements (boxfort, libgit2, ...) only a static link
# needs; this one is relocatable and names none, so pkg-config --cflags works without them.
cat > "$D/lib/pkgconfig/criterion.pc" <<EOF
prefix=\${pcfiledir}/../..
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: criterion
Description: Criterion $(pkgconf --modversion criterion), carried by bench/gpu/make_deps.sh
Version: $(pkgconf --modversion criterion)
Libs: -L\${libdir} -lcriterion
Cflags: -I\${includedir}
EOF
libs=("$D"/lib/*.so*)
echo "make_deps: wrote $D ($(du -sh "$D" | cut -f1)): ${#libs[@]} libraries"
