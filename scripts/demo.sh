#!/usr/bin/env bash
# Installs what is needed, builds, and runs the demo (extra arguments go to `alpamayo-expert demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/alpamayo-expert demo "$@"
