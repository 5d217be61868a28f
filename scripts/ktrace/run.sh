#!/usr/bin/env bash
# Builds ktrace.c against the machine's CUPTI and runs a command under it:
#
#   scripts/ktrace/run.sh TRACE.csv kiln bench ...
#   python3 scripts/ktrace/ktrace.py TRACE.csv
#
# (the GPU machine has CUPTI with its CUDA toolkit; nothing here needs Go).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
trace=$1
shift
inc=$(dirname "$(find /usr/local/cuda*/ /usr/include /opt -name cupti_activity.h 2>/dev/null | head -1)")
lib=$(dirname "$(find /usr/local/cuda*/ /usr/lib* /opt -name 'libcupti.so*' 2>/dev/null | head -1)")
so=${TMPDIR:-/tmp}/ktrace.so
rm -f "$so"
for v in 11 10 9 8; do
	if gcc -shared -fPIC -O2 -DKTRACE_KREC=$v -I"$inc" "$here/ktrace.c" -L"$lib" -lcupti -lpthread -Wl,-rpath,"$lib" -o "$so" 2>/dev/null; then
		break
	fi
done
[ -f "$so" ] || { echo "ktrace: no build against $inc" >&2; exit 1; }
KILN_KTRACE=$trace CUDA_INJECTION64_PATH=$so "$@"
