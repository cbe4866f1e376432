#!/usr/bin/env bash
# Makes sure libjpeg-turbo's headers and library are installed, so that build.rs compiles the
# JPEG region decoder (host/csrc/jpeg.c; without them JPEGs are decoded by the slower `image`
# crate): installs Debian's `libjpeg62-turbo-dev` (Ubuntu: `libjpeg-turbo8-dev`) with apt-get
# when jpeglib.h is missing and we are root. Set TESSERA_JPEG_DIR to a prefix with include/ and
# lib/ to use a libjpeg-turbo built elsewhere. Prints nothing; fails only when it cannot install.
set -euo pipefail
for dir in ${TESSERA_JPEG_DIR:+"$TESSERA_JPEG_DIR/include"} /usr/include /usr/local/include; do
  if [ -f "$dir/jpeglib.h" ]; then
    exit 0
  fi
done
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-libjpeg.sh: libjpeg-turbo's jpeglib.h not found and cannot apt-get; install \
libjpeg62-turbo-dev (Debian) or libjpeg-turbo8-dev (Ubuntu) for the faster JPEG decoding" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
package=libjpeg62-turbo-dev
if ! apt-cache show "$package" >/dev/null 2>&1; then
  package=libjpeg-turbo8-dev
fi
echo "installing $package (libjpeg-turbo) for the JPEG decoder" >&2
apt-get install -y -qq --no-install-recommends "$package" >&2
