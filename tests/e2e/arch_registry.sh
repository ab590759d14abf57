#!/usr/bin/env bash
# e2e: an architecture is one file plus one registration line (docs/models.md "Adding an
# architecture"). Checks the sources: every line of src/model/arch_list.h names an ops table that
# exactly one src/model/arch_*.c defines, with a name no other file of src/model/arch_*.c uses;
# every ops table defined is registered; the shared model code (model.c, mla.c, moe.c,
# model_int.h) names no architecture. Then the built binary loads and runs every registered one.
set -u
BUILD=${BUILD:-build}
KV=$BUILD/kvtier
M=src/model
fails=0
ok()  { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }

ops=$(sed -n 's/^KVT_ARCH_ENTRY([A-Z0-9_]*, *[0-9]*, *\(kvt_arch_[a-z0-9_]*\)).*/\1/p' $M/arch_list.h)
[ -n "$ops" ] || bad "no KVT_ARCH_ENTRY line in $M/arch_list.h"
names=()
for o in $ops; do
  defs=$(grep -l "^const kvt_arch_ops $o = {" $M/arch_*.c 2>/dev/null)
  if [ "$(echo "$defs" | grep -c .)" != 1 ]; then bad "$o: defined in [${defs//$'\n'/ }], want exactly one arch_*.c"; continue; fi
  name=$(sed -n "/^const kvt_arch_ops $o = {/,/^};/s/^ *\.name = \"\([^\"]*\)\",.*/\1/p" "$defs")
  [ -n "$name" ] || { bad "$o: no .name in $defs"; continue; }
  users=$(grep -l "\"$name\"" $M/arch_*.c)
  if [ "$users" = "$defs" ]; then ok "$name: $defs + arch_list.h"; else bad "$name: named in [${users//$'\n'/ }]"; fi
  names+=("$name")
done
for f in $M/arch_*.c; do
  for o in $(sed -n 's/^const kvt_arch_ops \(kvt_arch_[a-z0-9_]*\) = {.*/\1/p' "$f"); do
    grep -q "^KVT_ARCH_ENTRY([A-Z0-9_]*, *[0-9]*, *$o)" $M/arch_list.h || bad "$f: $o is not registered in arch_list.h"
  done
done
for f in $M/model.c $M/mla.c $M/moe.c $M/model_int.h; do
  hits=$(grep -n 'KVT_ARCH_[A-Z]' "$f" | grep -v 'KVT_ARCH_ENTRY')
  for n in "${names[@]}"; do hits+=$(grep -n "\"$n\"" "$f"); done
  if [ -z "$hits" ]; then ok "$f names no architecture"; else bad "$f names an architecture: $hits"; fi
done

# the binary: a gen-model file of every registered family loads under its name and runs a forward
# pass (`bench` of a few tokens)
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-arch-XXXXXX")
trap 'rm -rf "$T"' EXIT
for n in "${names[@]}"; do
  if ! "$KV" gen-model --arch "$n" --shape tiny -o "$T/$n.gguf" >/dev/null 2>&1; then bad "gen-model --arch $n"; continue; fi
  out=$("$KV" bench -m "$T/$n.gguf" -p 8 -n 2 -r 1 -t 1 --membw-mib 0 2>&1)
  if echo "$out" | grep -q "random $n .*| tg2 |"; then ok "binary: $n loads and runs"; else bad "binary: $n: $out"; fi
done
[ $fails -eq 0 ] && echo "arch_registry: all ok" || echo "arch_registry: $fails failed"
[ $fails -eq 0 ]
