#!/usr/bin/env bash
# The VQA demo (scripts/run_demo.sh vqa, which sets up .venv and the MiniLM link first): writes the
# VQA-format demo data (demo/make_vqa_demo_data.py), its region features with
# tools/extract_features.py (a ResNet-50 with random weights and zero-init residuals: no pretrained
# ResNet is available offline) and their memory-mapped cache, fine-tunes cfgs/vqa/demo_cpu.yaml on 2
# processes, then prints the official val accuracy (vqa/val.py) and writes the test JSON (vqa/test.py).
# Safe to run again: the data is rewritten only when its generator changed; a finished run is
# picked up by TRAIN.AUTO_RESUME.
#   usage: demo/run_demo_vqa.sh [extra train_end2end.py args, e.g. --opts TRAIN.END_EPOCH 2]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
CFG=cfgs/vqa/demo_cpu.yaml
DATA=data/demo_vqa
FEATURES=$DATA/vgbua_res101_precomputed
MODEL_DIR=./

stamp=$DATA/.generator-sha256
want="$(cat demo/make_demo_data.py demo/make_vqa_demo_data.py tools/extract_features.py $CFG | sha256sum | cut -c1-16)"
if [ ! -d "$FEATURES/test2015_resnet101_faster_rcnn_genome_36.cache" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    rm -rf "$DATA"
    "$PY" demo/make_vqa_demo_data.py --out "$DATA"
    "$PY" -c "import runpy, sys; runpy.run_path('bench/smoke_paper_config.py')['random_resnet_file'](sys.argv[1], 50)" \
        "$DATA/resnet50-random"
    for part in trainval test2015; do
        folder=$FEATURES/${part}_resnet101_faster_rcnn_genome_36
        "$PY" tools/extract_features.py --boxes "$DATA/boxes_$part.json" --image-root "$DATA" --out "$folder" \
            --cfg "$CFG" --weights "$DATA/resnet50-random-0000.model"
        "$PY" tools/build_feature_cache.py "$folder" --out "$folder.cache"
    done
    echo "$want" > "$stamp"
fi

NGPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
NPROC=2
if [ "$NGPUS" -eq 0 ]; then
    export CUDA_VISIBLE_DEVICES=""
elif [ "$NGPUS" -eq 1 ]; then
    NPROC=1  # one process accumulating 2 micro-batches: the same 32 questions per step
    set -- "$@" $([[ " $* " =~ " --opts " ]] || echo --opts) TRAIN.GRAD_ACCUMULATE_STEPS 2
fi
./scripts/dist_run_single.sh "$NPROC" vqa/train_end2end.py "$CFG" "$MODEL_DIR" "$@"

OUT="$MODEL_DIR/output/vl-bert/vqa/demo_cpu/train2014_train"
# What made the features, for tools/predict.py on a photo (the predictor reads it next to the checkpoint: common/checkpoint/features.py):
# the demo's photos get their listed boxes, any other photo a 4x4 grid (with one warning).
cat > "$OUT/feature_extractor.json" <<JSON
{"cfg": "$CFG", "weights": "$DATA/resnet50-random-0000.model",
 "box_source": {"kind": "file", "box_files": ["$DATA/boxes_trainval.json", "$DATA/boxes_test2015.json",
                                              "$DATA/boxes_val2014.json"],
                "fallback": {"kind": "grid", "grid": "4x4"}}}
JSON
CKPT="$OUT/vl-bert_demo_vqa-best.model"
"$PY" vqa/val.py --cfg "$CFG" --ckpt "$CKPT" --result-path "$OUT/val_result" --result-name demo
"$PY" vqa/test.py --cfg "$CFG" --ckpt "$CKPT" --result-path "$OUT/test_result" --result-name demo

cat <<MSG

VQA demo done.
  checkpoints:  $OUT/vl-bert_demo_vqa-*.model
  val answers:  $OUT/val_result/demo_vqa2_val2014.json
  test JSON:    $OUT/test_result/demo_vqa2_test2015.json (the EvalAI format)
  log + config: $OUT/*.log, $OUT/config.yaml
  one photo:    .venv/bin/python tools/predict.py --cfg $CFG --ckpt $CKPT --image $DATA/test2015/<image> \\
                    --question "what color is the leftmost shape ?"   (docs/predict.md)
MSG
