#!/usr/bin/env bash
# Prints the path of a headless-capable Chromium, installing Debian's `chromium` package when
# none is found and we are root (apt-get, no recommended packages). tests/trainer/explore.rs opens the
# explorer's report.html in it; scripts/test.sh exports the path as TESSERA_CHROMIUM.
# Set TESSERA_CHROMIUM to use another browser binary.
set -euo pipefail
find_chromium() {
  if [ -n "${TESSERA_CHROMIUM:-}" ] && [ -x "$TESSERA_CHROMIUM" ]; then
    echo "$TESSERA_CHROMIUM"
    return 0
  fi
  for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
      command -v "$name"
      return 0
    fi
  done
  return 1
}
if find_chromium; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "ensure-chromium.sh: no chromium found and not root; install Debian's \`chromium\` package" >&2
  exit 1
fi
echo "installing Debian's chromium package" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends chromium >&2
find_chromium
