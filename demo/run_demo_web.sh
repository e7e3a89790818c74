#!/usr/bin/env bash
# The web page on the VQA demo checkpoint (scripts/run_demo.sh web): installs the page's requirements
# (scripts/setup_env.sh --demo), trains the VQA demo first when its checkpoint is missing
# (demo/run_demo_vqa.sh), then serves it with tools/serve_demo.py, which prints the URL
# (http://127.0.0.1:7860 by default). The photos you upload go through the image encoder that made the
# demo's features (--feature-weights: the random ResNet-50 of run_demo_vqa.sh), their boxes from a 4x4 grid
# (the demo's own box files list only its photos; on 40 of its val scenes the grid answers 15 right, the
# files' boxes 17). Your serve_demo.py args come last and win. Ctrl-C stops it.
#   usage: demo/run_demo_web.sh [serve_demo.py args, e.g. --port 7861]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup_env.sh" --demo
CFG=cfgs/vqa/demo_cpu.yaml
CKPT=output/vl-bert/vqa/demo_cpu/train2014_train/vl-bert_demo_vqa-best.model
ENCODER=data/demo_vqa/resnet50-random-0000.model
if [ ! -f "$CKPT" ] || [ ! -f "$ENCODER" ]; then
    echo "[web] no VQA demo checkpoint at $CKPT yet: training it first (demo/run_demo_vqa.sh)"
    "$ROOT/demo/run_demo_vqa.sh"
fi
exec "$ROOT/.venv/bin/python" tools/serve_demo.py --cfg "$CFG" --ckpt "$CKPT" --feature-weights "$ENCODER" \
    --box-source grid --grid 4x4 "$@"
