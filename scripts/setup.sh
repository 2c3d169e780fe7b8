#!/usr/bin/env bash
# Installs what the project needs on Debian 12 and builds it.
#   scripts/setup.sh          Debian packages + build
#   scripts/setup.sh --python also the pinned Python packages (requirements.txt) in a virtualenv, and the
#                             Python module (pip install .) into it
# The virtualenv lives in $ALPAMAYO_VENV (default ~/.cache/alpamayo-expert/venv) and is reused while
# requirements.txt is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
need_apt() {
  local missing=""
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    echo "== apt-get install$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
  fi
}

need_apt build-essential cmake libgtest-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev libdnnl-dev ccache
. scripts/compiler-env.sh

if [ "${1:-}" = "--python" ]; then
  VENV="${ALPAMAYO_VENV:-$HOME/.cache/alpamayo-expert/venv}"
  if ! command -v python3 >/dev/null || ! python3 -c "import venv, ensurepip" 2>/dev/null; then
    need_apt python3 python3-venv python3-pip
  fi
  # The Python module's build needs the interpreter's headers (Debian's python3-dev).
  if ! python3 -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then
    need_apt python3-dev
  fi
  stamp="$VENV/.requirements.sha256"
  want="$(sha256sum requirements.txt | cut -d' ' -f1)"
  if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "== Python packages into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -r requirements.txt
    echo "$want" > "$stamp"
  fi
fi

echo "== build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
