#!/usr/bin/env bash
# Quantized weights and the hybrid/MoE paths on the GPU machine, kiln beside llama.cpp on the same
# files, from the repository root:
#
#   scripts/gpu-quant-bench.sh build     # start llama.cpp's CUDA build in the background (gpu-llama.sh)
#   scripts/gpu-quant-bench.sh files     # write the GGUF files both engines read (kiln synth, llama-quantize)
#   scripts/gpu-quant-bench.sh kiln      # kiln bench: FP8 / Q8_0 / Q4_K / MoE / Qwen3-Next figures
#   scripts/gpu-quant-bench.sh llama     # llama-bench on the same files (after build)
#
# Binaries are built beforehand on any machine with Go (go build -o .carry/cuda/kiln ./cmd/kiln) and the
# llama.cpp source travels in .carry/peers (a copy of ../shared/peers). State lives in /tmp, so the steps
# can run in chained calls while the machine is warm. Logs and JSON go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-quant}
mkdir -p "$OUT"
KILN=$PWD/.carry/cuda/kiln
LL=/tmp/ll/llsrc/build/bin
F=/tmp/qfiles
mkdir -p "$F"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache}

bench() { # name, then kiln bench arguments
	local name=$1
	shift
	"$KILN" bench --backend cuda --json "$@" >"$OUT/$name.json" 2>"$OUT/$name.log" || { echo "$name: FAIL"; tail -3 "$OUT/$name.log"; return; }
	python3 - "$name" "$OUT/$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
for x in r["results"]:
    print(f"{sys.argv[1]:<28} {x['kind']:<8} b{x['batch']:<3} ctx {x['context']:<6} {x['tok_s']:9.1f} tok/s  floor {x['floor_tok_s']:9.1f}  ratio {x['ratio']:.3f}")
PY
}

case "${1:-}" in
build)
	scripts/gpu-llama.sh start
	;;
files)
	scripts/gpu-llama.sh wait || exit 1
	[ -f $F/q8-f16.gguf ] || "$KILN" synth --synthetic qwen3-8b --dtype f16 --vocab-from testdata/quant/qwen3-w256-Q8_0.gguf --out $F/q8-f16.gguf
	for t in Q8_0 Q4_K_M; do
		[ -f $F/q8-$t.gguf ] || "$LL/llama-quantize" $F/q8-f16.gguf $F/q8-$t.gguf $t 16 >"$OUT/quantize-$t.log" 2>&1 || echo "quantize $t: FAIL"
	done
	ls -la $F
	;;
kiln)
	D="--batches 1,16,64 --contexts 1024 --prefill 4096 --steps 64"
	for t in fp8 q8_0 q4_k; do bench "qwen3-8b-$t" --synthetic qwen3-8b --dtype $t $D; done
	for t in Q8_0 Q4_K_M; do [ -f $F/q8-$t.gguf ] && bench "gguf-8b-$t" --model $F/q8-$t.gguf $D; done
	bench qwen3-30b-a3b-bf16 --synthetic qwen3-30b-a3b --batches 1,64 --contexts 1024 --prefill 4096 --steps 32
	bench qwen3-30b-a3b-fp8 --synthetic qwen3-30b-a3b --dtype fp8 --batches 1,64 --contexts 1024 --prefill 4096 --steps 32
	bench qwen3-30b-a3b-q4_k --synthetic qwen3-30b-a3b --dtype q4_k --batches 1,64 --contexts 1024 --prefill 4096 --steps 32
	bench qwen3-next-12 --synthetic qwen3-next-80b-a3b --layers 12 --batches 1,64 --contexts 1024 --prefill 4096,16384 --steps 32
	;;
llama)
	scripts/gpu-llama.sh wait || exit 1
	for t in Q8_0 Q4_K_M; do
		"$LL/llama-bench" -m $F/q8-$t.gguf -ngl 99 -fa 1 -p 4096 -n 128 -d 1024 -o json >"$OUT/llama-$t.json" 2>"$OUT/llama-$t.log" || { echo "llama $t: FAIL"; tail -3 "$OUT/llama-$t.log"; continue; }
		python3 - "$t" "$OUT/llama-$t.json" <<'PY'
import json, sys
for x in json.load(open(sys.argv[2])):
    kind = "prefill" if x["n_prompt"] else "decode"
    print(f"llama.cpp 8B {sys.argv[1]:<8} {kind:<8} {x['avg_ts']:9.1f} tok/s")
PY
	done
	;;
*)
	echo "usage: $0 build|files|kiln|llama" >&2
	exit 2
	;;
esac
