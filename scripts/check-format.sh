#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Checks that every tracked C and C++ file is formatted as .clang-format says, with Debian's
# clang-format (installed when missing). Prints the files that differ and exits 1 if any does;
# `--fix` rewrites them instead.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

case ${1:-} in
  "") mode=check ;;
  --fix) mode=fix ;;
  -h | --help) sed -n '3,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "check-format.sh: unknown argument '$1' (--fix, --help)" >&2; exit 2 ;;
esac
oktopk_install_missing clang-format
cd "$OKTOPK_SOURCE_DIR"
mapfile -t files < <(git ls-files -- '*.hpp' '*.cpp' '*.h' '*.c')
((${#files[@]})) || { echo "check-format: no C or C++ files tracked" >&2; exit 1; }
if [ "$mode" = fix ]; then
  clang-format -i --style=file "${files[@]}"
  echo "check-format: formatted ${#files[@]} files"
  exit 0
fi
differ=()
for f in "${files[@]}"; do
  clang-format --style=file "$f" | cmp -s - "$f" || differ+=("$f")
done
if ((${#differ[@]})); then
  printf 'check-format: not formatted as .clang-format says: %s\n' "${differ[@]}"
  echo "check-format: ${#differ[@]} of ${#files[@]} files differ (bash scripts/check-format.sh --fix)"
  exit 1
fi
echo "check-format: ${#files[@]} files formatted as .clang-format says ($(clang-format --version))"
