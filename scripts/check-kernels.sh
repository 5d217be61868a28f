#!/usr/bin/env bash
# Compiles every CUDA kernel file the way the backend does at run time
# (headers in front, fast math, sm_90 by default) with a local nvcc, and
# prints each kernel's registers and any spills: a compile check for machines
# without a GPU (Debian: apt install nvidia-cuda-toolkit). Skips without nvcc.
#
#   scripts/check-kernels.sh [arch]     # e.g. sm_90 (default), sm_80
#
# KILN_CUDA_NVRTC_FLAGS (the -D switches the backend passes NVRTC for A/B
# runs) is passed to nvcc too.
set -euo pipefail
cd "$(dirname "$0")/../backend/cuda/kernels"
if ! command -v nvcc >/dev/null; then
	echo "check-kernels: no nvcc, skipped"
	exit 0
fi
arch=${1:-sm_90}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
# The headers in front, as kernelSources puts them: defines.cuh (generated
# from Go), then the others.
headers="defines.cuh $(ls *.cuh | grep -vx defines.cuh)"
for f in *.cu; do
	{ for h in $headers; do echo "#line 1 \"$h\""; cat "$h"; done; echo "#line 1 \"$f\""; cat "$f"; } >"$tmp/$f"
	if ! nvcc -arch="$arch" -std=c++17 --use_fast_math ${KILN_CUDA_NVRTC_FLAGS:-} -cubin -Xptxas -v "$tmp/$f" -o "$tmp/${f%.cu}.cubin" >"$tmp/$f.log" 2>&1; then
		grep -v '^ptxas info' "$tmp/$f.log" >&2
		status=1
		continue
	fi
	# One line per kernel: name, registers, and spilled bytes if any.
	awk '/Compiling entry function/ { name = $7; gsub(/\047/, "", name) }
		/spill stores/ { spill = $5 }
		/Used [0-9]+ registers/ { printf "%-36s %4d regs%s\n", name, $5, (spill > 0 ? ", " spill " bytes spilled" : "") }' "$tmp/$f.log"
done
exit $status
