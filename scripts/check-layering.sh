#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Checks the include rules of docs/design.md, reading #include lines only (nothing is built):
#   - every header under include/oktopk/ includes OkTopk headers of its own floor or below;
#   - an algorithm (impl/algorithms/) includes no other algorithm, only their base;
#   - the bindings (src/c, src/fortran, src/python) and the programs (apps/) include no
#     internal header (oktopk/impl/...);
#   - oktopk/oktopk.hpp reaches, through its includes, none of the bodies liboktopk compiles
#     (impl/algorithms/, impl/factory/, impl/oracle/, the handle's members).
# Prints one line per broken rule and exits 1 if there is any; `--help` prints this.
set -euo pipefail

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '3,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
[ $# -eq 0 ] || { echo "check-layering.sh: takes no arguments (--help)" >&2; exit 2; }
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The floor of a header, by its path under include/oktopk/ (docs/design.md, "Floors").
floor_of() {
  case $1 in
    fwd.hpp | error.hpp | config.hpp | algorithm.hpp | options.hpp | layout.hpp | shards.hpp | \
      section_file.hpp | half.hpp | device.hpp | impl/base/*) echo 1 ;;
    select.hpp | topk.hpp | pack.hpp | residual.hpp | impl/kernels/*) echo 2 ;;
    communicator.hpp | node_topology.hpp | progress.hpp | gpu_aware_mpi.hpp | simulated_mpi.hpp | \
      impl/comm/*) echo 3 ;;
    impl/collectives/*) echo 4 ;;
    stats.hpp | sparse_allreduce.hpp | impl/handle/*) echo 5 ;;
    impl/algorithms/*) echo 6 ;;
    make_sparse_allreduce.hpp | oracle.hpp | oktopk.hpp | any_space.hpp | impl/factory/* | \
      impl/oracle/*) echo 7 ;;
    c_api.h) echo 8 ;;
    *) echo 0 ;;
  esac
}

problems=0
report() {
  echo "check-layering: $*"
  problems=$((problems + 1))
}

# included FILE: the OkTopk headers FILE includes, one per line, as paths under oktopk/.
included() {
  sed -n 's@^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]oktopk/\([^>"]*\)[>"].*@\1@p' "$1"
}

headers=$(cd include/oktopk && find . -type f \( -name '*.hpp' -o -name '*.h' \) | sed 's@^\./@@' | sort)
[ -n "$headers" ] || { echo "check-layering: no headers under include/oktopk" >&2; exit 1; }
for header in $headers; do
  own=$(floor_of "$header")
  [ "$own" != 0 ] || { report "include/oktopk/$header has no floor (add it to floor_of)"; continue; }
  for target in $(included "include/oktopk/$header"); do
    theirs=$(floor_of "$target")
    if [ "$theirs" = 0 ]; then
      report "include/oktopk/$header includes oktopk/$target, which has no floor"
    elif [ "$theirs" -gt "$own" ]; then
      report "include/oktopk/$header (floor $own) includes oktopk/$target (floor $theirs)"
    fi
    case $header:$target in
      impl/algorithms/method_base.hpp:*) ;;
      impl/algorithms/*:impl/algorithms/method_base.hpp) ;;
      impl/algorithms/*:impl/algorithms/*)
        report "include/oktopk/$header includes another algorithm, oktopk/$target" ;;
    esac
  done
done

outside=$(git ls-files -- apps src/c src/fortran src/python 2>/dev/null || true)
[ -n "$outside" ] || outside=$(find apps src/c src/fortran src/python -type f)
for file in $outside; do
  case $file in *.hpp | *.cpp | *.h | *.c | *.f90 | *.F90) ;; *) continue ;; esac
  [ -f "$file" ] || continue
  for target in $(included "$file"); do
    case $target in impl/*) report "$file includes the internal header oktopk/$target" ;; esac
  done
done

# What a program that includes the umbrella header parses: its includes, followed to the end.
reached=" oktopk.hpp "
pending="oktopk.hpp"
while [ -n "$pending" ]; do
  next=""
  for header in $pending; do
    [ -f "include/oktopk/$header" ] || continue
    for target in $(included "include/oktopk/$header"); do
      case $reached in *" $target "*) continue ;; esac
      reached="$reached$target "
      next="$next $target"
    done
  done
  pending=$next
done
for header in $reached; do
  case $header in
    impl/algorithms/* | impl/factory/* | impl/oracle/* | impl/handle/sparse_allreduce_members.hpp)
      report "oktopk/oktopk.hpp reaches oktopk/$header, a body liboktopk compiles" ;;
  esac
done

if [ "$problems" -ne 0 ]; then
  echo "check-layering: $problems include(s) break the rules of docs/design.md"
  exit 1
fi
echo "check-layering: $(echo "$headers" | wc -l) headers on their floors; no internal header in apps/ or the bindings; oktopk.hpp reaches $(echo $reached | wc -w) headers, no compiled body"
