#!/usr/bin/env bash
# Builds a pip-installable wheel of Tessera: the binary, the bundled plugins and the
# tessera-plugin-api crate (what scripts/install.sh installs), as the Python package `tessera`
# with a `tessera` command, depending on torch==2.13.0 for libtorch (the command runs the binary
# on the installed torch's libtorch). Like tools that ship a binary through PyPI, the wheel is
# tagged for this platform and any Python 3.
#
# Usage: scripts/build-wheel.sh [--out DIR] [--no-build]
#   --out DIR     where the wheel goes (default target/wheels)
#   --no-build    package what target/release already holds
# Prints the wheel's path. The `wheel` tool (PyPI) is installed once into ~/.cache/tessera.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=target/wheels
BUILD=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
    --no-build) BUILD=(--no-build); shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-wheel.sh: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TESSERA_TORCH_VERSION:-2.13.0}
VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)"
case "$(uname -m)" in
  x86_64) PLATFORM=linux_x86_64 ;;
  aarch64) PLATFORM=linux_aarch64 ;;
  *) echo "build-wheel.sh: no wheel platform tag known for $(uname -m)" >&2; exit 1 ;;
esac

# The `wheel` tool, in a cache folder of its own.
CACHE=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
WHEEL_TOOL="$CACHE/wheel-0.45.1"
if [ ! -f "$WHEEL_TOOL/wheel/__init__.py" ]; then
  mkdir -p "$CACHE"
  rm -rf "$WHEEL_TOOL.partial.$$"
  echo "installing the wheel tool (PyPI wheel==0.45.1) into $WHEEL_TOOL" >&2
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
    --target "$WHEEL_TOOL.partial.$$" "wheel==0.45.1" >&2
  rm -rf "$WHEEL_TOOL"
  mv "$WHEEL_TOOL.partial.$$" "$WHEEL_TOOL"
fi

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
TREE="$STAGE/tessera-$VERSION"
mkdir -p "$TREE"
# The package: the launcher, and the installation's layout inside it (bin/, lib/, share/), so
# the binary finds its plugins and plugin-api exactly as in an installation.
cp -r scripts/wheel/tessera "$TREE/tessera"
find "$TREE/tessera" -name __pycache__ -prune -exec rm -rf {} +
sed -i "s/@VERSION@/$VERSION/; s/@TORCH_VERSION@/$TORCH_VERSION/" \
  "$TREE/tessera/__init__.py" "$TREE/tessera/__main__.py"
./scripts/install.sh --prefix "$TREE/tessera" "${BUILD[@]}" >&2

INFO="$TREE/tessera-$VERSION.dist-info"
mkdir -p "$INFO"
cat >"$INFO/METADATA" <<EOF
Metadata-Version: 2.1
Name: tessera
Version: $VERSION
Summary: A fast deep-learning trainer on libtorch whose speed-up methods are binary plugins
License: MIT OR Apache-2.0
Requires-Python: >=3.8
Requires-Dist: torch==$TORCH_VERSION
EOF
cat >"$INFO/WHEEL" <<EOF
Wheel-Version: 1.0
Generator: tessera scripts/build-wheel.sh
Root-Is-Purelib: false
Tag: py3-none-$PLATFORM
EOF
cat >"$INFO/entry_points.txt" <<EOF
[console_scripts]
tessera = tessera.__main__:main
EOF

mkdir -p "$OUT"
PYTHONPATH="$WHEEL_TOOL" "$PYTHON" -m wheel pack --dest-dir "$OUT" "$TREE" >&2
WHEEL="$OUT/tessera-$VERSION-py3-none-$PLATFORM.whl"
if [ ! -f "$WHEEL" ]; then
  echo "build-wheel.sh: the wheel tool did not write $WHEEL" >&2
  exit 1
fi
echo "$WHEEL"
