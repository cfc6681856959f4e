#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Checks that the README's commands work on a brand-new Debian 12: builds a minimal bookworm
# root (debootstrap --variant=minbase) from the mirror this system's apt uses, puts a fresh clone
# of this repository's committed HEAD in it, and runs the two commands of the README's ```sh
# blocks there as root, timing each. Run as root; the root is built in a temporary directory
# and removed afterwards (its /proc, /sys and /dev are unmounted first, also on failure or
# Ctrl-C).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: bash scripts/fresh-root.sh [--test-only | --main-only] [--keep] [--help]

Builds a new `debootstrap --variant=minbase bookworm` root in a temporary directory, clones this
repository into it (committed work only), copies this system's apt sources into it, and runs
the README's main and test commands there as root, printing each one's wall time. Exits
non-zero if either fails.

  --test-only  run only the README's test command (scripts/test.sh)
  --main-only  run only the README's main command (scripts/main.sh): the same installs, a
               shorter build
  --keep       keep the root afterwards (unmounted) instead of removing it
  -h, --help   show this help

The main command runs with OKTOPK_EPOCHS=1 unless OKTOPK_EPOCHS is set. TMPDIR (default
/var/tmp) chooses where the root goes; it needs about 10 GB.
USAGE
}

only_test=0 only_main=0 keep=0
while (($#)); do
  case $1 in
    --test-only) only_test=1 ;;
    --main-only) only_main=1 ;;
    --keep) keep=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fresh-root.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if ((only_test && only_main)); then
  echo "fresh-root.sh: --test-only and --main-only exclude each other" >&2
  exit 2
fi

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ "$(id -u)" -eq 0 ] || { echo "fresh-root.sh: run as root (debootstrap, mount, chroot)" >&2; exit 1; }

suite=bookworm
# The mirror and key this system's apt uses for its own release's main component.
oktopk_apt_main_source "$(oktopk_codename)"
mirror=${OKTOPK_APT_URIS%% *}
keyring_opt=()
signed_by=$(echo "$OKTOPK_APT_SIGNED_BY" | sed 's/^[ \t]*//')
if [[ $signed_by == /*.gpg && $signed_by != *[[:space:]]* && -f $signed_by ]]; then
  keyring_opt=("--keyring=$signed_by")
fi

if ! command -v debootstrap > /dev/null; then
  oktopk_log "installing debootstrap"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/oktopk-fresh-root.XXXXXX")
root=$work/root
mounted=()
cleanup() {
  local status=$? i
  set +e
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R "${mounted[i]}" 2> /dev/null || umount -l "${mounted[i]}"
  done
  if awk -v r="$root/" 'index($2, r) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    echo "fresh-root.sh: something is still mounted under $root: left in place" >&2
  elif ((keep)); then
    oktopk_log "kept the root in $root"
  else
    rm -rf --one-file-system "$work"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

elapsed() { echo "$(($(date +%s) - $1)) s"; }

t=$(date +%s)
oktopk_log "debootstrap --variant=minbase $suite $root $mirror"
debootstrap --variant=minbase "${keyring_opt[@]}" "$suite" "$root" "$mirror" \
  > "$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
oktopk_log "debootstrap: $(elapsed "$t")"

# apt inside the root uses exactly this system's sources (and the keys they name).
eval "$(apt-config shell apt_list Dir::Etc::SourceList/f apt_parts Dir::Etc::SourceParts/d)"
rm -f "$root/etc/apt/sources.list"
mkdir -p "$root/etc/apt/sources.list.d"
[ ! -f "$apt_list" ] || cp "$apt_list" "$root/etc/apt/sources.list"
for f in "${apt_parts%/}"/*; do
  case $f in *.list|*.sources) [ -f "$f" ] && cp "$f" "$root/etc/apt/sources.list.d/" ;; esac
done
for f in $(cat "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/* 2> /dev/null |
           grep -o -i -E 'signed-by(=|:[ \t]*)/[^] \t]+' | sed -E 's/^[^/]*//' | sort -u); do
  [ -e "$root$f" ] || [ ! -f "$f" ] || { mkdir -p "$root$(dirname "$f")"; cp "$f" "$root$f"; }
done
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2> /dev/null || true

for m in proc sys dev; do
  mount --rbind "/$m" "$root/$m"
  mounted+=("$root/$m")
  mount --make-rslave "$root/$m"
done

# A fresh clone of the committed HEAD, as a new user would get it.
git clone --quiet "$OKTOPK_SOURCE_DIR" "$root/root/oktopk"
oktopk_log "cloned $(git -C "$root/root/oktopk" log -1 --format='%h %s')"
[ -z "$(git -C "$OKTOPK_SOURCE_DIR" status --porcelain --untracked-files=no)" ] ||
  oktopk_log "note: uncommitted changes in $OKTOPK_SOURCE_DIR are not in the clone"

# The README's commands: the single lines of its ```sh blocks, main first, then test.
readarray -t commands < <(awk '
  /^```sh[ \t]*$/ { block = 1; n = 0; next }
  block && /^```/ { block = 0; if (n == 1) print line; next }
  block { n++; line = $0 }' "$root/root/oktopk/README.md")
if ((${#commands[@]} != 2)); then
  echo "fresh-root.sh: expected two one-line \`\`\`sh blocks in README.md (main, then test)," \
       "found ${#commands[@]}" >&2
  exit 1
fi
names=(main test)
if ((only_test)); then
  names=(test)
  commands=("${commands[1]}")
elif ((only_main)); then
  names=(main)
  commands=("${commands[0]}")
fi

epochs=${OKTOPK_EPOCHS:-1}
results=()
failed=0
for i in "${!commands[@]}"; do
  oktopk_log "in the fresh root, as root: ${commands[i]}   (OKTOPK_EPOCHS=$epochs)"
  t=$(date +%s)
  status=0
  chroot "$root" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin OKTOPK_EPOCHS="$epochs" \
    /bin/bash -c "cd /root/oktopk && ${commands[i]}" || status=$?
  results+=("${names[i]} command '${commands[i]}': $(elapsed "$t"), exit status $status")
  oktopk_log "${results[-1]}"
  ((status == 0)) || failed=1
done
echo
echo "fresh bookworm root, README commands:"
printf '  %s\n' "${results[@]}"
exit "$failed"
