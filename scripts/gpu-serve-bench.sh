#!/usr/bin/env bash
# The serving benchmark of issue 6 on the GPU machine, from the repository root:
#
#   scripts/gpu-serve-bench.sh
#
# Needs .carry/cuda/kiln (go build -o .carry/cuda/kiln ./cmd/kiln, on any
# machine with Go). It checks the engine end to end on CUDA with the qwen3
# fixture, makes a random Qwen3-8B (bf16) with scripts/hf_reference.py (which
# also times HF transformers on it), gives it a tokenizer (the 8000-token
# test tokenizer: the random-length workload sends token-id prompts below its
# vocabulary, and ids it lacks decode to nothing, as in HF), and runs
# kiln bench serve: 256 requests of 512 in / 128 out at max concurrency 16
# and 64. Results go to $OUT (or /tmp/kiln-serve).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-serve}
mkdir -p "$OUT"
KILN=.carry/cuda/kiln
MODEL=${SERVE_MODEL:-/tmp/qwen3-8b-synth}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache}
export PYTHONUNBUFFERED=1

echo "== engine on CUDA, qwen3 fixture"
timeout 240 $KILN bench serve --model testdata/fixtures/qwen3 --backend cuda --num-prompts 32 \
	--input-len 64 --output-len 32 --max-concurrency 8 2>&1 | tee "$OUT/fixture.log" | tail -20

echo "== random Qwen3-8B and the HF baseline"
if [ ! -f "$MODEL/hf_reference.json" ]; then
	timeout 420 python3 scripts/hf_reference.py --out "$MODEL" --layers 36 >"$OUT/hf.log" 2>&1 || { tail -20 "$OUT/hf.log"; exit 1; }
fi
tail -1 "$OUT/hf.log"
cp testdata/tokenizer/qwen3/tokenizer.json testdata/fixtures/qwen3/tokenizer_config.json \
	testdata/fixtures/qwen3/chat_template.jinja "$MODEL/"

for c in 16 64; do
	echo "== kiln bench serve, max concurrency $c"
	timeout 300 $KILN bench serve --model "$MODEL" --backend cuda --num-prompts 256 --input-len 512 \
		--output-len 128 --max-concurrency $c --max-running $c --percentiles 50,90,99 \
		--output-json "$OUT/serve-c$c.json" 2>&1 | tee "$OUT/serve-c$c.log" | tail -30
done
