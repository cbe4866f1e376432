#!/usr/bin/env bash
# Writes the two seed inputs of corpus/plugin_elf: the smallest shared libraries gcc makes, one
# exporting the Tessera root-module symbol (accepted) and one without it (refused).
set -euo pipefail
cd "$(dirname "$0")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
printf 'const char _1as_0lib_1header_0root_bmodule_bloader[8] = {0};\n' >"$tmp/plugin.c"
printf 'int f(void) { return 1; }\n' >"$tmp/other.c"
flags=(-shared -nostdlib -s -Os -Wl,-z,noseparate-code -Wl,--hash-style=gnu -Wl,--build-id=none
  -Wl,-z,norelro -Wl,-z,max-page-size=16 -Wl,-z,common-page-size=16)
gcc "${flags[@]}" -o corpus/plugin_elf/tiny-plugin.so "$tmp/plugin.c"
gcc "${flags[@]}" -o corpus/plugin_elf/no-symbol.so "$tmp/other.c"
