#!/usr/bin/env bash
# Compiles every CUDA kernel file the way the backend does at run time
# (headers in front, fast math) for each target the project supports,
# sm_80, sm_86, sm_89 and sm_90a by default: a compile check for machines
# without a GPU. Exits non-zero when a kernel fails to compile for one.
#
#   scripts/check-kernels.sh [arch...]   # e.g. sm_90a, or sm_80 sm_89, or sm_80,sm_90
#
# With a local nvcc (Debian: apt install nvidia-cuda-toolkit) it compiles
# each file to a cubin and prints each kernel's registers and any spills.
# A target that nvcc cannot compile for (sm_90a before CUDA 12), or every
# target where there is no nvcc, is checked with NVRTC instead, as the
# backend compiles: the Go tests TestNVRTCCompile (every kernel file, for
# those targets), TestKernelSignatures and TestKernelDefines of
# backend/cuda, which need go and a libnvrtc that dlopen finds (on
# LD_LIBRARY_PATH or in ldconfig's cache; Debian trixie's libnvrtc12,
# extracted with dpkg -x, loads on bookworm): about 7 minutes on two
# cores for the four targets. With neither nvcc nor a libnvrtc it prints
# "skipped" and exits 0.
#
# KILN_CUDA_NVRTC_FLAGS (the -D switches the backend passes NVRTC for A/B
# runs) is passed to nvcc too; the NVRTC tests read it themselves.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

archs=()
for a in "${@:-sm_80 sm_86 sm_89 sm_90a}"; do
	for x in ${a//,/ }; do
		archs+=("$x")
	done
done

# hasNVRTC: a libnvrtc the backend's dlopen (libnvrtc.so.13, .so.12, .so)
# would find.
hasNVRTC() {
	local d n
	local IFS=:
	for d in ${LD_LIBRARY_PATH:-}; do
		for n in libnvrtc.so.13 libnvrtc.so.12 libnvrtc.so; do
			[ -n "$d" ] && [ -e "$d/$n" ] && return 0
		done
	done
	unset IFS
	local ldconfig
	ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
	[ -x "$ldconfig" ] && "$ldconfig" -p 2>/dev/null | grep -Eq 'libnvrtc\.so(\.1[23])? '
}

status=0
nvrtcArchs=()
if command -v nvcc >/dev/null; then
	cd "$root/backend/cuda/kernels"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# The headers in front, as kernelSources puts them: defines.cuh
	# (generated from Go), then the others.
	headers="defines.cuh $(ls *.cuh | grep -vx defines.cuh)"
	for f in *.cu; do
		{ for h in $headers; do echo "#line 1 \"$h\""; cat "$h"; done; echo "#line 1 \"$f\""; cat "$f"; } >"$tmp/$f"
	done
	codes=$(nvcc --list-gpu-code 2>/dev/null || true)
	nvccVersion=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
	for arch in "${archs[@]}"; do
		if [ -n "$codes" ] && ! grep -qx "$arch" <<<"$codes"; then
			echo "check-kernels: nvcc $nvccVersion cannot compile for $arch: NVRTC checks it"
			nvrtcArchs+=("$arch")
			continue
		fi
		echo "== $arch (nvcc $nvccVersion)"
		for f in *.cu; do
			if ! nvcc -arch="$arch" -std=c++17 --use_fast_math ${KILN_CUDA_NVRTC_FLAGS:-} -cubin -Xptxas -v "$tmp/$f" -o "$tmp/${f%.cu}.cubin" >"$tmp/$f.log" 2>&1; then
				echo "check-kernels: $f does not compile for $arch:" >&2
				grep -v '^ptxas info' "$tmp/$f.log" >&2
				status=1
				continue
			fi
			# One line per kernel: name, registers, and spilled bytes if any.
			awk '/Compiling entry function/ { name = $7; gsub(/\047/, "", name) }
				/spill stores/ { spill = $5 }
				/Used [0-9]+ registers/ { printf "%-36s %4d regs%s\n", name, $5, (spill > 0 ? ", " spill " bytes spilled" : "") }' "$tmp/$f.log"
		done
	done
	cd "$root"
else
	nvrtcArchs=("${archs[@]}")
fi

if [ ${#nvrtcArchs[@]} -gt 0 ]; then
	list=$(IFS=,; echo "${nvrtcArchs[*]}")
	if ! hasNVRTC; then
		if [ ${#nvrtcArchs[@]} -eq ${#archs[@]} ]; then
			echo "check-kernels: skipped: no nvcc and no libnvrtc (set LD_LIBRARY_PATH to a directory holding libnvrtc.so.12 or .13)"
			exit 0
		fi
		echo "check-kernels: no libnvrtc for $list: not checked" >&2
		exit 1
	fi
	if ! command -v go >/dev/null; then
		echo "check-kernels: $list need NVRTC's check, which needs go: not checked" >&2
		exit 1
	fi
	echo "== $list (NVRTC: go test ./backend/cuda)"
	log=$(mktemp)
	rc=0
	(cd "$root" && KILN_NVRTC_CHECK=$list go test -count=1 -timeout 60m -v \
		-run 'TestNVRTCCompile|TestKernelSignatures|TestKernelDefines' ./backend/cuda) >"$log" 2>&1 || rc=$?
	if grep -q -- '--- SKIP: TestNVRTCCompile' "$log"; then
		# A libnvrtc was found but did not load (or too old a version).
		grep -B2 -- '--- SKIP: TestNVRTCCompile' "$log" >&2
		echo "check-kernels: NVRTC did not load: $list not checked" >&2
		rm -f "$log"
		exit 1
	fi
	grep -E '^\s+kernel_test\.go:[0-9]+: NVRTC ' "$log" | sed 's/^\s*kernel_test\.go:[0-9]*: /  /' || true
	for arch in "${nvrtcArchs[@]}"; do
		ok=$(grep -c -- "--- PASS: TestNVRTCCompile/$arch/" "$log" || true)
		bad=$(grep -c -- "--- FAIL: TestNVRTCCompile/$arch/" "$log" || true)
		echo "  $arch: $ok kernel files compiled, $bad failed"
	done
	grep -E -- '--- (PASS|FAIL): TestKernel(Signatures|Defines)' "$log" | sed 's/^/  /' || true
	if [ $rc -ne 0 ]; then
		# The failures and their messages, without the passing subtests.
		grep -Ev -- '^=== (RUN|PAUSE|CONT)|^\s+--- PASS|^--- PASS' "$log" >&2
		status=1
	else
		tail -n 1 "$log"
	fi
	rm -f "$log"
fi
exit $status
