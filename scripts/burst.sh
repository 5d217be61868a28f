#!/usr/bin/env bash
# Issue 21's bar for work before admission: twelve concurrent 8 MiB prompts
# without a space against `kiln serve` (the demo model) in a memory cgroup
# limited to 2 GiB. Every one must be refused -- 400 context_length_exceeded
# when --max-body lets the bodies in, 413 at the default --max-body -- the
# server must stay alive and answer, and its RSS must be back under twice
# its idle RSS within 10 s. Prints the figures. Needs curl and a memory
# cgroup it can make (v1 or v2; without one, the limit is GOMEMLIMIT's,
# which the garbage collector only aims at). KILN=path tests that binary
# instead of building one (to compare with an older kiln). Run by
# scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((2 << 30))

tmp=$(mktemp -d)
pid=
cg=
cleanup() {
	if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	if [[ -n $cg ]]; then rmdir "$cg" 2>/dev/null || true; fi
	rm -rf "$tmp"
}
trap cleanup EXIT

kiln=${KILN:-}
if [[ -z $kiln ]]; then
	go build -o "$tmp/kiln" ./cmd/kiln
	kiln=$tmp/kiln
fi

# A memory cgroup beside this shell's, limited to $limit bytes.
v1=$(sed -n 's/^[0-9]*:memory:\(.*\)/\1/p' /proc/self/cgroup)
v2=$(sed -n 's/^0::\(.*\)/\1/p' /proc/self/cgroup)
if [[ -n $v1 && -w /sys/fs/cgroup/memory$v1 ]]; then
	cg=/sys/fs/cgroup/memory$v1/kiln-burst-$$
	mkdir "$cg" && echo "$limit" >"$cg/memory.limit_in_bytes" || cg=
elif [[ -z $v1 && -n $v2 && -w /sys/fs/cgroup$v2 && -e /sys/fs/cgroup$v2/memory.max ]]; then
	cg=/sys/fs/cgroup$v2/kiln-burst-$$
	mkdir "$cg" && echo "$limit" >"$cg/memory.max" || cg=
fi
if [[ -z $cg ]]; then
	echo "burst: no memory cgroup to make here; limiting with GOMEMLIMIT only" >&2
fi
# A chat request and a completion request, each with 8 MiB of one letter.
head -c $((8 << 20)) /dev/zero | tr '\0' 'x' >"$tmp/text"
{ printf '{"messages":[{"role":"user","content":"'; cat "$tmp/text"; printf '"}]}'; } >"$tmp/chat.json"
{ printf '{"prompt":"'; cat "$tmp/text"; printf '"}'; } >"$tmp/completion.json"

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
hwm_kb() { awk '/^VmHWM/ {print $2}' "/proc/$pid/status"; }

# burst FLAGS... WANT: starts a server with FLAGS, sends the twelve
# requests, and checks the bar with WANT as every status.
burst() {
	local want=${*: -1}
	local flags=("${@:1:$#-1}")
	# The server enters the cgroup before it starts: exec keeps the pid.
	GOMEMLIMIT=$limit CG=$cg bash -c '[[ -z $CG ]] || echo $$ >"$CG/cgroup.procs"; exec "$@"' - \
		"$kiln" serve --addr 127.0.0.1:0 --socket none "${flags[@]}" 2>"$tmp/log" &
	pid=$!
	local addr=
	for _ in $(seq 200); do
		addr=$(sed -n 's/.*msg=listening network=tcp addr=\([^ ]*\).*/\1/p' "$tmp/log")
		[[ -n $addr ]] && break
		sleep 0.05
	done
	[[ -n $addr ]] || { cat "$tmp/log"; echo "burst: the server did not start" >&2; return 1; }
	local url=http://$addr
	for _ in $(seq 200); do curl -sf "$url/health" >/dev/null && break; sleep 0.05; done
	# Idle: after a normal request, settled.
	curl -sf "$url/v1/chat/completions" -H 'Content-Type: application/json' \
		-d '{"messages":[{"role":"user","content":"Write a Go function."}],"max_tokens":8}' >/dev/null
	sleep 1
	local idle
	idle=$(rss_kb)

	local start=$SECONDS
	for i in $(seq 12); do
		local body=$tmp/chat.json path=/v1/chat/completions
		if ((i % 2 == 0)); then body=$tmp/completion.json path=/v1/completions; fi
		curl -s -o /dev/null -w '%{http_code}\n' "$url$path" -H 'Content-Type: application/json' --data-binary "@$body" >"$tmp/status.$i" &
	done
	wait $(jobs -p | grep -v "^$pid$") 2>/dev/null || true
	local statuses
	statuses=$(cat "$tmp"/status.* | sort | uniq -c | tr -s ' ' | tr '\n' ';')
	rm -f "$tmp"/status.*
	kill -0 "$pid" 2>/dev/null || { tail -5 "$tmp/log"; echo "burst: the server died" >&2; pid=; return 1; }
	curl -sf "$url/health" >/dev/null || { echo "burst: the server does not answer /health" >&2; return 1; }
	curl -sf "$url/v1/chat/completions" -H 'Content-Type: application/json' \
		-d '{"messages":[{"role":"user","content":"still there?"}],"max_tokens":4}' >/dev/null ||
		{ echo "burst: the server does not answer a chat" >&2; return 1; }
	local peak after waited=0
	peak=$(hwm_kb)
	after=$(rss_kb)
	while ((after > 2 * idle && waited < 100)); do
		sleep 0.1
		waited=$((waited + 1))
		after=$(rss_kb)
	done
	echo "burst ${flags[*]}: statuses [${statuses}] in $((SECONDS - start)) s; RSS idle $((idle / 1024)) MB, peak $((peak / 1024)) MB, $((after / 1024)) MB after $((waited * 100)) ms"
	grep -o 'msg="request limits".*' "$tmp/log" || true
	if [[ $statuses != " 12 $want;" ]]; then
		echo "burst: want 12 x $want" >&2
		return 1
	fi
	if ((after > 2 * idle)); then
		echo "burst: RSS $((after / 1024)) MB 10 s after the burst, over twice the idle $((idle / 1024)) MB" >&2
		return 1
	fi
	kill "$pid"
	wait "$pid" || true
	pid=
}

burst --max-body $((16 << 20)) 400
burst 413
