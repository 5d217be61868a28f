#!/usr/bin/env bash
# llama.cpp's build for the GPU scripts that measure kiln beside it (gpu-followups.sh,
# gpu-quant-bench.sh), from the source in .carry/peers (a copy of ../shared/peers) into /tmp/ll,
# in the background and at nice 19, so that kiln's own figures can be taken meanwhile:
#
#   scripts/gpu-llama.sh start   # ~5 minutes on the GPU machine's 16 cores (log /tmp/ll/build.log)
#   scripts/gpu-llama.sh wait    # until no build runs; fails when none left the binaries
#
# LLAMA_MODE=cpu builds for the CPU (the scripts' flow on a machine without a GPU); CUDA_ARCH
# (default 90a) picks the GPU's.
set -uo pipefail
cd "$(dirname "$0")/.."
dest=/tmp/ll
case "${1:-}" in
start)
	mkdir -p "$dest"
	(CUDA_ARCH=${CUDA_ARCH:-90a} setsid nohup nice -n 19 bash .carry/peers/build-llama.sh "$dest" "${LLAMA_MODE:-cuda}" >"$dest/build.log" 2>&1 &)
	echo "building llama.cpp in $dest (log $dest/build.log)"
	;;
wait)
	while pgrep -f build-llama.sh >/dev/null; do sleep 5; done
	[ -x "$dest/llsrc/build/bin/llama-server" ] || { echo "no llama.cpp build in $dest (scripts/gpu-llama.sh start first; log $dest/build.log)" >&2; exit 1; }
	;;
*)
	echo "usage: $0 start|wait" >&2
	exit 2
	;;
esac
