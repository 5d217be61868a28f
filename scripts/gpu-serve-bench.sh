#!/usr/bin/env bash
# The serving benchmark of issue 6 on the GPU machine, from the repository root:
#
#   scripts/gpu-serve-bench.sh
#
# Needs .carry/cuda/kiln (go build -o .carry/cuda/kiln ./cmd/kiln, on any
# machine with Go). It checks the engine end to end on CUDA with the qwen3
# fixture, makes a random Qwen3-8B (bf16) with scripts/hf_reference.py (which
# also times HF transformers on it), gives it a tokenizer (the 8000-token
# test tokenizer, its vocabulary padded with tokens "t<id>" to the model's
# 151936 so that every generated id streams as text), and runs
# kiln bench serve: 256 requests of 512 in / 128 out at max concurrency 16
# and 64 (SERVE_CONCURRENCY="16" for one). Results go to $OUT (or
# /tmp/kiln-serve).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-serve}
mkdir -p "$OUT"
KILN=.carry/cuda/kiln
MODEL=${SERVE_MODEL:-/tmp/qwen3-8b-synth}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache}
export PYTHONUNBUFFERED=1

echo "== engine on CUDA, qwen3 fixture"
[ -n "${SERVE_SKIP_FIXTURE:-}" ] || timeout 240 $KILN bench serve --model testdata/fixtures/qwen3 --backend cuda --num-prompts 32 \
	--input-len 64 --output-len 32 --max-concurrency 8 2>&1 | tee "$OUT/fixture.log" | tail -20

echo "== random Qwen3-8B and the HF baseline"
if [ ! -f "$MODEL/hf_reference.json" ]; then
	timeout 420 python3 scripts/hf_reference.py --out "$MODEL" --layers 36 >"$OUT/hf.log" 2>&1 || { tail -20 "$OUT/hf.log"; exit 1; }
fi
tail -1 "$OUT/hf.log"
python3 - testdata/tokenizer/qwen3/tokenizer.json "$MODEL/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
vocab = t["model"]["vocab"]
used = set(vocab.values()) | {a["id"] for a in t["added_tokens"]}
for i in range(151936):
    if i not in used:
        vocab[f"t{i}"] = i
json.dump(t, open(sys.argv[2], "w"))
PY
cp testdata/fixtures/qwen3/tokenizer_config.json testdata/fixtures/qwen3/chat_template.jinja "$MODEL/"

for c in ${SERVE_CONCURRENCY:-16 64}; do
	echo "== kiln bench serve, max concurrency $c"
	timeout 300 $KILN bench serve --model "$MODEL" --backend cuda --num-prompts 256 --input-len 512 \
		--output-len 128 --max-concurrency $c --max-running $c --percentiles 50,90,99 \
		--output-json "$OUT/serve-c$c.json" 2>&1 | tee "$OUT/serve-c$c.log" | tail -30
done
