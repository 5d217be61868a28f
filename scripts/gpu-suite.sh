#!/usr/bin/env bash
# The GPU test suite, run on the GPU machine from the repository root:
#
#   scripts/gpu-suite.sh            # everything (about 8 minutes on an H100)
#   SUITE_SKIP_HF=1 scripts/gpu-suite.sh   # kernel and fixture tests only
#
# It needs the binaries built beforehand on any machine with Go:
#   go test -c -o .carry/cuda/cuda.test ./backend/cuda
#   go build -o .carry/cuda/kiln ./cmd/kiln
# and runs
#   1. the CUDA backend's tests: every kernel against the CPU backend on random
#      inputs, graph capture and replay, on-device sampling against the
#      reference sampler, the fixtures end to end, the fixtures split across
#      the GPUs through NCCL (two of them where there are two; a group of one
#      otherwise) (KILN_REQUIRE_GPU=1: a missing GPU fails instead of
#      skipping);
#   2. scripts/hf_reference.py: a random Qwen3-8B in transformers (bf16),
#      saved as safetensors, its last-position logits for a fixed prompt, and
#      HF eager decode/prefill timings;
#   3. the kiln-vs-transformers logits comparison on that model;
#   4. kiln bench on that model directory;
#   5. the logits comparison again on a Qwen3-Next-shaped model (4 layers),
#      three prompts, the CPU backend beside the GPU;
# and prints one table at the end. Logs go to $OUT (or /tmp/kiln-suite).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-suite}
mkdir -p "$OUT"
BIN=.carry/cuda
MODEL=${SUITE_MODEL:-/tmp/qwen3-8b-synth}
LAYERS=${SUITE_LAYERS:-36}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache}
export PYTHONUNBUFFERED=1
declare -a rows

row() { rows+=("$(printf '%-44s %s' "$1" "$2")"); }

# 1. Kernel, graph, sampling and fixture tests.
(cd backend/cuda && KILN_REQUIRE_GPU=1 "../../$BIN/cuda.test" -test.v -test.count=1 -test.run "${SUITE_RUN:-.}" -test.skip TestHFReference) >"$OUT/cuda-test.log" 2>&1
status=$?
for t in $(grep -oE '^--- (PASS|FAIL|SKIP): [A-Za-z0-9_/]+' "$OUT/cuda-test.log" | sed 's/^--- //; s/: /:/'); do
	row "test ${t#*:}" "${t%%:*}"
done
[ $status -eq 0 ] || row "cuda tests (see cuda-test.log)" "FAIL (exit $status)"

if [ -z "${SUITE_SKIP_HF:-}" ]; then
	# 2. The transformers baseline and reference logits.
	if [ ! -f "$MODEL/hf_reference.json" ]; then
		python3 scripts/hf_reference.py --out "$MODEL" --layers "$LAYERS" >"$OUT/hf.log" 2>&1 || row "hf_reference.py (see hf.log)" "FAIL"
	fi
	if [ -f "$MODEL/hf_reference.json" ]; then
		python3 - "$MODEL/hf_reference.json" >"$OUT/hf-timing.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for k, v in r["timing"].items():
    print(f"HF transformers {k.replace('_tok_s', '')}\t{v:.1f} tok/s")
PY
		while IFS=$'\t' read -r k v; do row "$k" "$v"; done <"$OUT/hf-timing.txt"
		# 3. kiln against transformers on the same input.
		(cd backend/cuda && KILN_REQUIRE_GPU=1 KILN_HF_REF="$MODEL" "../../$BIN/cuda.test" -test.v -test.count=1 -test.run TestHFReference) >"$OUT/hf-compare.log" 2>&1
		st=$?
		row "kiln vs transformers fp32 logits" "$( (grep -oE 'relative L2 [0-9.e+-]+ \(prefill\), [0-9.e+-]+ \(decode\)' "$OUT/hf-compare.log" || echo '?') | head -1) $([ $st -eq 0 ] && echo PASS || echo FAIL)"
		# 4. kiln bench on the same model.
		"$BIN/kiln" bench --model "$MODEL" --backend cuda ${SUITE_BENCH_ARGS:-} --json >"$OUT/bench.json" 2>"$OUT/bench.log"
		st=$?
		if [ $st -eq 0 ]; then
			python3 - "$OUT/bench.json" >"$OUT/bench.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["results"]:
    print(f"kiln {x['kind']} batch {x['batch']} ctx {x['context']}\t{x['tok_s']:.1f} tok/s (floor {x['floor_tok_s']:.1f}, ratio {x['ratio']:.3f})")
PY
			while IFS=$'\t' read -r k v; do row "$k" "$v"; done <"$OUT/bench.txt"
		else
			row "kiln bench (see bench.log)" "FAIL (exit $st)"
		fi
	fi
	# 5. kiln against transformers on Qwen3-Next's shape (four layers: three
	# Gated DeltaNet, one gated attention), prompts of 48, 300 and 1500
	# tokens, the CPU backend beside the GPU.
	NEXT=${SUITE_NEXT_MODEL:-/tmp/qwen3next-4l-synth}
	if [ ! -f "$NEXT/hf_reference.json" ]; then
		python3 scripts/hf_reference.py --arch qwen3next --layers 4 --prompts 48,300,1500 --out "$NEXT" >"$OUT/hf-next.log" 2>&1 || row "hf_reference.py --arch qwen3next (see hf-next.log)" "FAIL"
	fi
	if [ -f "$NEXT/hf_reference.json" ]; then
		(cd backend/cuda && KILN_REQUIRE_GPU=1 KILN_HF_REF="$NEXT" KILN_HF_REF_CPU=1 "../../$BIN/cuda.test" -test.v -test.count=1 -test.run TestHFReference) >"$OUT/hf-next-compare.log" 2>&1
		st=$?
		row "kiln vs transformers fp32, Qwen3-Next shape" "$(grep -cE 'cuda, bf16 KV.*relative L2' "$OUT/hf-next-compare.log") prompts $([ $st -eq 0 ] && echo PASS || echo FAIL)"
	fi
fi

echo
echo "kiln GPU suite — $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%FT%TZ)"
printf '%s\n' "${rows[@]}"
