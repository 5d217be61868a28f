#!/usr/bin/env bash
# Packs the training corpus of the embedded demo model (see demo/README.md):
# the hand-written, non-test Go sources of the Go distribution's src tree,
# under its BSD licence, plus the licence and Qwen3's chat template, into
# .carry/demo/ for scripts/train_demo.py on the GPU machine (which has no Go).
#
# Skipped: _test.go files, testdata/ and vendor/ trees (vendored code carries
# other licences) and generated files ("// Code generated ... DO NOT EDIT.").
#
# usage: scripts/pack_go_corpus.sh CHAT_TEMPLATE [GOROOT]
set -euo pipefail
template=${1:?usage: pack_go_corpus.sh CHAT_TEMPLATE [GOROOT]}
goroot=${2:-$(go env GOROOT)}
cd "$(dirname "$0")/.."
out=$PWD/.carry/demo
mkdir -p "$out"
list=$(mktemp)
trap 'rm -f "$list"' EXIT
(cd "$goroot" && find src -name '*.go' ! -name '*_test.go' \
	-not -path '*/testdata/*' -not -path '*/vendor/*' -print0 |
	xargs -0 grep -L -m1 '^// Code generated .* DO NOT EDIT\.$' | LC_ALL=C sort) >"$list"
tar -C "$goroot" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
	-cJf "$out/go-src.tar.xz" LICENSE -T "$list"
cp "$template" "$out/chat_template.jinja"
echo "$(wc -l <"$list") files from $goroot ($("$goroot/bin/go" version)) -> $out/go-src.tar.xz ($(du -h "$out/go-src.tar.xz" | cut -f1))"
