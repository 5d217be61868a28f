#!/usr/bin/env bash
# The serving benchmark of issue 6 on the GPU machine, from the repository root:
#
#   scripts/gpu-serve-bench.sh
#
# Needs .carry/cuda/kiln (go build -o .carry/cuda/kiln ./cmd/kiln, on any
# machine with Go). It checks the engine end to end on CUDA with the qwen3
# fixture, and stop strings through the OpenAI API with the demo model;
# makes a random Qwen3-8B (bf16) with scripts/hf_reference.py (which also
# times HF transformers on it), gives it a tokenizer (the 8000-token test
# tokenizer, its vocabulary padded with tokens "t<id>" to the model's
# 151936 so that every generated id streams as text), and runs kiln bench
# serve: 256 requests of 512 in / 128 out at max concurrency 16 and 64
# (SERVE_CONCURRENCY="16" for one). Results go to $OUT (or /tmp/kiln-serve).
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

echo "== stop strings through the OpenAI API on CUDA (demo model, streamed)"
# Tokens are emitted while the next pass runs, so a stop string ends its
# answer one pass late on a GPU: the streamed text must still stop exactly
# before it, as the same backend's answer without the stop string shows.
timeout 120 python3 - "$KILN" "${SERVE_BACKEND:-cuda}" <<'PY'
import json, subprocess, sys, time, urllib.request
kiln, backend = sys.argv[1], sys.argv[2]
srv = subprocess.Popen([kiln, "serve", "--backend", backend, "--addr", "127.0.0.1:18431", "--socket", "none"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def post(body):
    req = urllib.request.Request("http://127.0.0.1:18431/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60)
def complete(prompt, **kw):
    body = {"model": model, "prompt": prompt, "max_tokens": 48, "temperature": 0, "stream": True, **kw}
    text, finish = "", None
    for line in post(body):
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        c = json.loads(line[6:])["choices"][0]
        text += c.get("text") or ""
        finish = c.get("finish_reason") or finish
    return text, finish
try:
    for _ in range(120):
        try:
            models = json.load(urllib.request.urlopen("http://127.0.0.1:18431/v1/models", timeout=2))
            break
        except OSError:
            time.sleep(0.5)
    model = models["data"][0]["id"]
    bad = 0
    for prompt in ["func main() {", "// Reverse returns s reversed.\nfunc Reverse(s string) string {", "package http\n\nimport ("]:
        full, _ = complete(prompt)
        k = len(full) // 2
        while k < len(full) and full[k].isspace():
            k += 1
        stop = full[k:k + 3]
        cut = full[:full.index(stop)] if stop else full
        got, finish = complete(prompt, stop=[stop])
        ok = bool(stop.strip()) and got == cut and finish == "stop"
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} stop {stop!r}: {got!r} ({finish}), want {cut!r}")
    sys.exit(1 if bad else 0)
finally:
    srv.terminate()
    srv.wait()
PY
echo "stop strings: $([ $? -eq 0 ] && echo PASS || echo FAIL)"

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
