#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# kjv-corpus.sh OUT: writes the King James Bible, one verse a line ("Ge1:1 In the beginning
# God created ..."), to OUT: the text oktopk-train --model lstm learns. Needs the Debian packages
# bible-kjv (the program `bible`) and bible-kjv-text (its compressed data file); the text is in
# the public domain (/usr/share/doc/bible-kjv-text/copyright). The build runs this once.
set -euo pipefail
out=${1:?usage: kjv-corpus.sh OUT}
command -v bible > /dev/null ||
  { echo "kjv-corpus.sh: no program 'bible' (Debian package bible-kjv)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
tmp=$(mktemp "$out.XXXXXX")
trap 'rm -f "$tmp"' EXIT
# -f toggles pretty-printing off: one verse a line, led by its reference. The range is the whole
# Bible. stdin from /dev/null, or bible would go on reading references from it.
bible -f Gen1:1-Rev22:21 < /dev/null > "$tmp"
verses=$(wc -l < "$tmp")
# The King James Bible has 31,102 verses; fewer means a missing or damaged data file.
[ "$verses" -eq 31102 ] ||
  { echo "kjv-corpus.sh: bible printed $verses verses, expected 31102 (is bible-kjv-text installed?)" >&2; exit 1; }
chmod 644 "$tmp"  # mktemp makes it private; the text is public
mv "$tmp" "$out"
trap - EXIT
