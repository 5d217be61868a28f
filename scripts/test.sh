#!/usr/bin/env bash
# The test suite: every package, the concurrent ones (engine, server) under the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."
go vet ./...
race_pkgs="./engine/... ./server/... ./kvcache/..."
go test -count=1 -timeout 45m $(go list ./... | grep -v -e /engine -e /server -e /kvcache)
go test -count=1 -race -timeout 45m $race_pkgs
