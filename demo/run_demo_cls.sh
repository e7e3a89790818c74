#!/usr/bin/env bash
# The image-classification demo (scripts/run_demo.sh cls): writes the generated 10-class set
# (demo/make_cls_demo_data.py, once), trains a tiny ViT from scratch with the recipe of
# cfgs/cls/demo_cpu.yaml on 2 CPU processes, prints the val top-1 / top-5 of the best checkpoint and
# writes the curves PNG. Safe to run again: a finished run is picked up by TRAIN.AUTO_RESUME.
#   usage: demo/run_demo_cls.sh [extra train_end2end.py args, e.g. --opts TRAIN.END_EPOCH 2]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
CFG=cfgs/cls/demo_cpu.yaml
MODEL_DIR=./

stamp=data/demo_cls/.generator-sha256
want="$(sha256sum demo/make_cls_demo_data.py | cut -c1-16)"
if [ ! -f data/demo_cls/test_batch ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    rm -rf data/demo_cls
    "$PY" demo/make_cls_demo_data.py --out data/demo_cls
    echo "$want" > "$stamp"
fi

export CUDA_VISIBLE_DEVICES=""
./scripts/dist_run_single.sh 2 cls/train_end2end.py "$CFG" "$MODEL_DIR" "$@"

OUT="$MODEL_DIR/output/cls/demo_cpu/train_train"
"$PY" cls/val.py --cfg "$CFG" --ckpt "$OUT/vit_tiny_demo-best.model"
"$PY" tools/plot_curves.py "$OUT"
echo "run folder: $OUT (log, TensorBoard events, checkpoints, curves.png)"
