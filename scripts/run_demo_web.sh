#!/usr/bin/env bash
# The web page on the VQA demo checkpoint (scripts/run_demo.sh web): installs the page's requirements
# (scripts/setup_env.sh --demo), trains the VQA demo first when its checkpoint is missing
# (scripts/run_demo_vqa.sh), then serves it with scripts/serve_demo.py, which prints the URL
# (http://127.0.0.1:7860 by default). The run folder's feature_extractor.json names the image encoder
# that made the demo's features, so the photos you upload go through the same one. Ctrl-C stops it.
#   usage: scripts/run_demo_web.sh [serve_demo.py args, e.g. --port 7861]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup_env.sh" --demo
CFG=cfgs/vqa/demo_cpu.yaml
OUT=output/vl-bert/vqa/demo_cpu/train2014_train
CKPT=$OUT/vl-bert_demo_vqa-best.model
if [ ! -f "$CKPT" ] || [ ! -f "$OUT/feature_extractor.json" ]; then
    echo "[web] no VQA demo checkpoint at $CKPT yet: training it first (scripts/run_demo_vqa.sh)"
    "$ROOT/scripts/run_demo_vqa.sh"
fi
exec "$ROOT/.venv/bin/python" scripts/serve_demo.py --cfg "$CFG" --ckpt "$CKPT" "$@"
