#!/usr/bin/env bash
# The planner on the README's example (gpt-tiny on two nodes of four devices,
# from tp2 pp2 dp2 to tp4 pp1 dp2, then with node n1 lost), then a real mount
# on this machine doing the same change with NumPy reading every partition.
set -euo pipefail
cd "$(dirname "$0")/.."
MLFS=${MLFS:-${BUILD:-build}/mlfs}
E=examples/gpt-tiny

echo "== mlfs plan: tp2 pp2 dp2 -> tp4 pp1 dp2 on n0, n1"
$MLFS plan --schema $E/schema.json --from $E/config-tp2pp2dp2.json \
	--to $E/config-tp4pp1dp2.json --cluster $E/cluster.json
echo
echo "== the first operations of that plan (mlfs plan --json)"
$MLFS plan --schema $E/schema.json --from $E/config-tp2pp2dp2.json \
	--to $E/config-tp4pp1dp2.json --cluster $E/cluster.json --json |
	/usr/bin/python3 -c 'import json,sys
j=json.load(sys.stdin)
for op in j["operations"][:6]:
    src = "" if op["op"] == "zero" else " <- %s rank %d %s row %d" % (op["src_node"], op["src_rank"], op["src_tensor"], op["src_row"])
    print("  %-5s %s rank %d %s/%s rows [%d, %d)%s" % (op["op"], op["node"], op["rank"], op["state"], op["tensor"], op["row"], op["row"] + op["rows"], src))'
echo
echo "== n1 fails: shrink to tp2 pp1 dp1 on n0 alone"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo '{"version": 3, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]}' >"$tmp/shrink.json"
if ! $MLFS plan --schema $E/schema.json --from $E/config-tp2pp2dp2.json \
	--to "$tmp/shrink.json" --cluster $E/cluster.json --down n1; then
	echo "(refused: stage 1 lived only on n1; with dp replicas on both nodes it would succeed)"
fi
echo
echo "== the same loss with a DP replica on each node: served from the survivor"
echo '{"version": 1, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n0", "n1"]}' >"$tmp/dp2.json"
$MLFS plan --schema $E/schema.json --from "$tmp/dp2.json" --to "$tmp/shrink.json" \
	--cluster $E/cluster.json --down n1
echo
echo "== a real mount: import a checkpoint, reconfigure, check with NumPy"
/usr/bin/python3 examples/elastic_demo.py
echo
echo "== three nodes on this machine, one etcd: a node-set change, then a node killed"
/usr/bin/python3 examples/cluster_demo.py
echo
echo "== real training: a GPT (PyTorch, gloo on CPU) changes tp, pp and dp in the middle of its run"
/usr/bin/python3 examples/elastic_train.py --steps-per-layout 4
echo
echo "== elastic without a human: kill -9 of a node mid-step, the job relays itself out, the node returns"
/usr/bin/python3 examples/elastic_auto.py
