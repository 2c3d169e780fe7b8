#!/usr/bin/env bash
# Installs everything, builds, and runs every test: GoogleTest through ctest, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
VENV="${ALPAMAYO_VENV:-$HOME/.cache/alpamayo-expert/venv}"
echo "== ctest"
ctest --test-dir build --output-on-failure -j"$(nproc)"
echo "== pytest"
ALPAMAYO_CLI="$PWD/build/alpamayo-expert" PYTHONPATH="$PWD/python" "$VENV/bin/python" -m pytest tests/python -q
