#!/usr/bin/env bash
# The test suite: every package, the concurrent ones (engine, session, server, kvcache) under the race detector,
# then a server under a memory limit against a burst of huge prompts (scripts/burst.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
go vet ./...
race_pkgs="./engine/... ./session/... ./server/... ./kvcache/..."
go test -count=1 -timeout 45m $(go list ./... | grep -v -e /engine -e /session -e /server -e /kvcache)
go test -count=1 -race -timeout 45m $race_pkgs
./scripts/burst.sh
