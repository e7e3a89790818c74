# Sourced by the launch scripts: argument check and the Python to run.
#   usage_check MIN_ARGS "USAGE" "$@"   exits 2 with the usage line when fewer arguments are given
#   $PYTHON                             the repository's .venv Python if present, else python3
usage_check() {
    local min=$1 usage=$2
    shift 2
    if [ $# -lt "$min" ]; then
        echo "usage: $(basename "$0") $usage" >&2
        exit 2
    fi
}
PYTHON="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python"
[ -x "$PYTHON" ] || PYTHON=python3
