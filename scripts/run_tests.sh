#!/usr/bin/env bash
# Installs what the tests need (once) and runs the default test suite (slow tests excluded).
#   usage: scripts/run_tests.sh [pytest args...]     e.g. --runslow, -k config
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh" --test
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -q "$@"
