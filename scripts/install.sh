#!/usr/bin/env bash
# Builds Tessera (release) and installs it under a prefix:
#   PREFIX/bin/tessera                          the binary (finds libtorch through its rpath)
#   PREFIX/lib/tessera/plugins/lib<name>.so     the bundled plugins (found without configuration)
#   PREFIX/share/tessera/plugin-api/            the tessera-plugin-api crate, for plugin authors
#   PREFIX/share/tessera/Cargo.lock             the dependency versions the host was built with
#
# Usage: scripts/install.sh [--prefix DIR] [--no-build]
#   --prefix DIR   where to install (default ~/.local)
#   --no-build     install what target/release already holds (no cargo build)
#
# libtorch stays where scripts/ensure-libtorch.sh keeps it (~/.cache/tessera/torch-2.13.0, or
# $LIBTORCH): keep that folder. Each file is replaced atomically (written beside, then renamed),
# so a tessera that is running, or an interrupted install, never sees half a file.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX="${HOME:?HOME is not set; pass --prefix DIR}/.local"
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) PREFIX="${2:?--prefix needs a folder}"; shift 2 ;;
    --prefix=*) PREFIX="${1#--prefix=}"; shift ;;
    --no-build) BUILD=0; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$PREFIX"
PREFIX="$(cd "$PREFIX" && pwd)"

# The bundled plugins: every crate under plugins/ that builds a cdylib (its library is
# lib<crate name>.so); the others there are shared Rust libraries of the plugins.
PLUGINS=()
for manifest in plugins/*/Cargo.toml; do
  grep -q cdylib "$manifest" || continue
  name="$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$manifest" | head -n 1)"
  PLUGINS+=("${name//-/_}")
done

RELEASE="${CARGO_TARGET_DIR:-target}/release"
if [ "$BUILD" = 1 ]; then
  LIBTORCH="$(./scripts/ensure-libtorch.sh)"
  export LIBTORCH
  # libjpeg-turbo for the JPEG region decoder (build.rs falls back to the `image` crate).
  ./scripts/ensure-libjpeg.sh || true
  # The whole workspace, as scripts/demo.sh and scripts/test.sh build it: the same features
  # resolved, so a build either of them made is reused as it is.
  echo "== building tessera and ${#PLUGINS[@]} plugins (release)" >&2
  cargo build --release --workspace
fi
missing=()
[ -f "$RELEASE/tessera" ] || missing+=("$RELEASE/tessera")
for p in "${PLUGINS[@]}"; do
  [ -f "$RELEASE/lib$p.so" ] || missing+=("$RELEASE/lib$p.so")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install.sh: missing ${missing[*]}; build first (run without --no-build)" >&2
  exit 1
fi

# Copies $1 to $2 atomically (a temporary file beside $2, then a rename), with mode $3.
put() {
  local tmp
  mkdir -p "$(dirname "$2")"
  tmp="$(dirname "$2")/.$(basename "$2").install.$$"
  cp "$1" "$tmp"
  chmod "$3" "$tmp"
  mv -f "$tmp" "$2"
}

put "$RELEASE/tessera" "$PREFIX/bin/tessera" 755
for p in "${PLUGINS[@]}"; do
  put "$RELEASE/lib$p.so" "$PREFIX/lib/tessera/plugins/lib$p.so" 644
done

# plugin-api as a stand-alone crate: `cargo package` writes it with a normalized Cargo.toml (the
# workspace's inherited keys filled in). Unpacked beside, then swapped in.
echo "== packaging tessera-plugin-api" >&2
PACKAGE_DIR="$(mktemp -d)"
trap 'rm -rf "$PACKAGE_DIR"' EXIT
cargo package --quiet --offline -p tessera-plugin-api --no-verify --allow-dirty \
  --target-dir "$PACKAGE_DIR/target" >&2
crate="$(ls "$PACKAGE_DIR"/target/package/tessera-plugin-api-*.crate)"
mkdir -p "$PREFIX/share/tessera" "$PACKAGE_DIR/unpacked"
tar -xzf "$crate" -C "$PACKAGE_DIR/unpacked"
NEW_API="$PREFIX/share/tessera/.plugin-api.install.$$"
rm -rf "$NEW_API"
mv "$PACKAGE_DIR"/unpacked/tessera-plugin-api-* "$NEW_API"
OLD_API="$PREFIX/share/tessera/.plugin-api.old.$$"
if [ -e "$PREFIX/share/tessera/plugin-api" ]; then
  mv "$PREFIX/share/tessera/plugin-api" "$OLD_API"
fi
mv "$NEW_API" "$PREFIX/share/tessera/plugin-api"
rm -rf "$OLD_API"
put Cargo.lock "$PREFIX/share/tessera/Cargo.lock" 644

echo "installed tessera into $PREFIX:"
echo "  $PREFIX/bin/tessera"
echo "  $PREFIX/lib/tessera/plugins/ (${#PLUGINS[@]} plugins)"
echo "  $PREFIX/share/tessera/plugin-api/ (tessera-plugin-api, for \`tessera new-plugin\`)"
case ":$PATH:" in
  *":$PREFIX/bin:"*) ;;
  *) echo "note: $PREFIX/bin is not on PATH; add it (export PATH=\"$PREFIX/bin:\$PATH\")" ;;
esac
