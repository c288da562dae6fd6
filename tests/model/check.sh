#!/usr/bin/env bash
# make test: the protocol model (protocol.pml) checked with spin, bounded:
# the rules of cluster/mlfs_decide.c keep both safety properties (no
# assertion fails, the "stale" claim holds) over every interleaving of
# three nodes, two proposers, two lease expiries, one daemon restart and
# one etcd outage; and the rules before them (-DOLD_RULES) violate each,
# so the model can tell.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v spin >/dev/null || { echo "model: spin is missing (make deps installs it)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
cp "$here/protocol.pml" .

# run NAME SPIN-FLAGS CC-FLAGS PAN-FLAGS: prints pan's error count.
run() {
	spin $2 -a protocol.pml >/dev/null
	gcc -O2 -w $3 -o "pan_$1" pan.c
	"./pan_$1" -m200000 $4 >"$1.out" 2>&1 || true
	grep -q "search depth too small" "$1.out" && { echo "model: $1: depth bound too small"; exit 1; }
	sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$1.out"
}
fail=0
n=$(run safety "" -DNOCLAIM "")
echo "model: assertions (no loss at a drop, aborts keep the layout): $n errors ($(grep -o '[0-9]* states, stored' safety.out))"
[ "$n" = 0 ] || { cat safety.out; fail=1; }
n=$(run stale "" "" -a)
echo "model: claim stale (version 2 is only ever etcd's committed layout): $n errors"
[ "$n" = 0 ] || { cat stale.out; fail=1; }
n=$(run old_safety -DOLD_RULES -DNOCLAIM "")
echo "model: the old rules lose a unit: $n errors (expected 1)"
[ "$n" = 1 ] || fail=1
n=$(run old_stale "-DOLD_RULES -DNO_LOSS" "" -a)
echo "model: the old rules commit a stale layout: $n errors (expected 1)"
[ "$n" = 1 ] || fail=1
exit $fail
