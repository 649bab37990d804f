#!/usr/bin/env bash
# compare.sh: run this benchmark and PyTorch's Gloo (gloo_allreduce.py, beside this
# script) side by side, alternating, ROUNDS times per world size, and print per size the
# median over rounds of each one's median time and busbw, and the ratios.
#
#   apt-get install -y python3-torch     # Debian's PyTorch, CPU, Gloo
#   examples/allreduce-bench/compare.sh [ROUNDS] [NP...]     # default: 3 rounds, np 2 4
#
# Env: GLOO (path of gloo_allreduce.py), SIZES (bytes, comma-separated), OUT (JSON lines file),
# BIN (a prebuilt allreduce-bench binary; default: build it).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
shift || true
NPS=${*:-2 4}
GLOO=${GLOO:-examples/allreduce-bench/gloo_allreduce.py}
SIZES=${SIZES:-4096,65536,1048576,16777216,67108864}
OUT=${OUT:-$(mktemp /tmp/allreduce-compare.XXXXXX.jsonl)}
if [ -z "${BIN:-}" ]; then
	BIN=$(mktemp -d)/allreduce-bench
	go build -o "$BIN" ./examples/allreduce-bench
fi
for r in $(seq "$ROUNDS"); do
	for np in $NPS; do
		/usr/bin/python3 "$GLOO" --world "$np" --sizes "$SIZES" | grep '"impl"' >>"$OUT"
		"$BIN" -np "$np" -sizes "$SIZES" -json >>"$OUT"
	done
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault((r["np"], r["size_bytes"], r["impl"]), []).append(r)
print(f"{'np':>3} {'size(B)':>10} {'gloo med(us)':>13} {'ours med(us)':>13} {'gloo busbw':>11} {'ours busbw':>11} {'busbw x':>8} {'time x':>7}")
for np_, size in sorted({(k[0], k[1]) for k in by}):
    g, o = by.get((np_, size, "gloo")), by.get((np_, size, "elastictrain"))
    if not g or not o:
        continue
    gm = statistics.median(x["median_s"] for x in g); om = statistics.median(x["median_s"] for x in o)
    gb = statistics.median(x["busbw_GBps"] for x in g); ob = statistics.median(x["busbw_GBps"] for x in o)
    print(f"{np_:>3} {size:>10} {gm*1e6:>13.1f} {om*1e6:>13.1f} {gb:>11.3f} {ob:>11.3f} {ob/gb:>8.2f} {gm/om:>7.2f}")
print(f"(raw JSON lines: {sys.argv[1]}; {len(rows)} runs x sizes)")
PY
