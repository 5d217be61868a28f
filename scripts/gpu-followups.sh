#!/usr/bin/env bash
# Follow-up turns after long histories (issue 19) on the GPU machine, kiln beside llama.cpp on the
# same files in one run, from the repository root:
#
#   scripts/gpu-followups.sh build   # llama.cpp's CUDA build, in the background (~5 minutes)
#   scripts/gpu-followups.sh         # the files, then each engine behind kiln bench serve; a table
#
# Binaries are built beforehand on any machine with Go (go build -o .carry/cuda/kiln ./cmd/kiln);
# the llama.cpp source travels in .carry/peers (a copy of ../shared/peers). The build, the files
# and the logs live in /tmp, so the two steps can run in chained calls while the machine is warm
# (the first waits for the build when it is still running).
#
# Models (FOLLOWUP_MODELS, default "qnext12 q8b"), both `kiln synth` files with the 512-token test
# vocabulary, whose ids are text (kiln bench serve times the first text; a file without
# --vocab-from generates ids that are none):
#   qnext12  Qwen3-Next's first 12 layers (9 DeltaNet, 3 gated attention, 512 experts), bf16, 37 GB;
#            histories of 750 / 7,500 / 37,300 words: about 2K / 20K / 100K tokens
#   q8b      Qwen3-8B, bf16, 16 GB; 750 / 7,500 / 13,000 words: about 2K / 20K / 35K tokens (its
#            context ends at 40,960)
# Each engine serves one model at a time: kiln serve, then llama-server -fa on -np 1, each behind
# kiln bench serve --dataset multiturn (3 conversations of 4 turns, 32 new tokens a turn, 1 s
# between turns). The figure is the later turns' TTFT, p50 and p99.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-followups}
mkdir -p "$OUT"
KILN=$PWD/.carry/cuda/kiln
LL=/tmp/ll/llsrc/build/bin
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache}

if [ "${1:-}" = build ]; then
	exec scripts/gpu-llama.sh start
fi

declare -A words=([qnext12]="750 7500 37300" [q8b]="750 7500 13000")
declare -A ctx=([qnext12]=131072 [q8b]=40960)
declare -A synth=([qnext12]="--synthetic qwen3-next-80b-a3b --layers 12" [q8b]="--synthetic qwen3-8b")
declare -a rows

# up waits until the server on port $1 answers $2 (llama-server's /health
# is 503 while it loads the model).
up() {
	for _ in $(seq 300); do
		curl -sf "http://127.0.0.1:$1$2" >/dev/null && return 0
		sleep 1
	done
	return 1
}

# turns runs the conversations against the server on port $2 for each history, as engine $1.
turns() {
	local engine=$1 port=$2 model=$3 h f
	for h in ${words[$model]}; do
		f="$OUT/$engine-$model-$h.txt"
		timeout 300 "$KILN" bench serve --base-url "http://127.0.0.1:$port" --dataset multiturn --num-prompts 3 \
			--turns 4 --input-len 32 --output-len 32 --max-concurrency 1 --think-time 1s --history-len "$h" \
			--percentiles 50,99 >"$f" 2>&1
		local p50 p99 cached tokens
		p50=$(awk -F: '/Median TTFT, later/ {gsub(/ /, "", $2); print $2}' "$f")
		p99=$(awk -F: '/P99 TTFT, later/ {gsub(/ /, "", $2); print $2}' "$f")
		cached=$(awk -F: '/Later-turn prompt tokens from cache/ {gsub(/ /, "", $2); print $2}' "$f")
		tokens=$(awk -F: '/Total input tokens/ {gsub(/ /, "", $2); print int($2 / 12)}' "$f")
		rows+=("$(printf '%-8s %-6s %6s words %7s tokens  p50 %8s ms  p99 %8s ms  %6s%% cached' "$model" "$engine" "$h" "${tokens:-?}" "${p50:-FAIL}" "${p99:-FAIL}" "${cached:-?}")")
	done
}

scripts/gpu-llama.sh wait || echo "kiln only"

for model in ${FOLLOWUP_MODELS:-qnext12 q8b}; do
	file=/tmp/followup-$model.gguf
	if [ ! -f "$file" ]; then
		# shellcheck disable=SC2086
		"$KILN" synth ${synth[$model]} --vocab-from testdata/quant/qwen3-w256-Q8_0.gguf --out "$file" >"$OUT/synth-$model.log" 2>&1 ||
			{ echo "$model: synth failed"; tail -3 "$OUT/synth-$model.log"; continue; }
	fi
	rm -rf "$XDG_CACHE_HOME/kiln/state" # a state cache of an earlier run would serve its conversations' first turns
	"$KILN" serve --model "$file" --backend cuda --addr 127.0.0.1:18471 --socket none >"$OUT/kiln-$model.log" 2>&1 &
	pid=$!
	if up 18471 /v1/models; then turns kiln 18471 "$model"; else echo "$model: kiln serve did not start"; tail -3 "$OUT/kiln-$model.log"; fi
	kill "$pid"
	wait "$pid" 2>/dev/null
	if [ -x "$LL/llama-server" ]; then
		"$LL/llama-server" -m "$file" -ngl 99 -fa on -np 1 -c "${ctx[$model]}" --port 18472 >"$OUT/llama-$model.log" 2>&1 &
		pid=$!
		if up 18472 /health; then turns llama 18472 "$model"; else echo "$model: llama-server did not start"; tail -3 "$OUT/llama-$model.log"; fi
		kill "$pid"
		wait "$pid" 2>/dev/null
	fi
done
printf '%s\n' "${rows[@]}" | tee "$OUT/table.txt"
