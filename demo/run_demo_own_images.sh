#!/usr/bin/env bash
# VQA on your own photos, start to end (walkthrough: data/PREPARE_DATA.md, "Your own photos and questions"):
#   1. boxes and region features of every photo (tools/extract_features.py --box-source grid|detector)
#   2. the VQA v2-format files (tools/own_vqa_data.py) and the answer vocabulary (tools/build_vqa_answers.py)
#   3. fine-tuning with NETWORK.PARTIAL_PRETRAIN (vqa/train_end2end.py)
#   4. predictions for the test questions (vqa/test.py)
#   5. attention maps of the fine-tuned checkpoint (pretrain/vis_attention_maps.py), a photo's first question
#      as its caption
# Without PHOTOS and QA_JSON it runs on an example (demo/own_images_example.py: the demo's photographs
# and questions). Start it as scripts/run_demo.sh own [...], which sets up .venv and the MiniLM link that
# the default config reads.
#   usage: demo/run_demo_own_images.sh [PHOTOS QA_JSON] [KEY VALUE ...]   (KEY VALUE: training --opts)
# Environment (defaults in brackets):
#   OUT [data/own_vqa; data/own_vqa_example for the example]   data, features and the run's output folder, of
#                               one PHOTOS and QA_JSON: the script refuses a folder written for others
#   CFG [cfgs/vqa/demo_cpu.yaml] VQA config (precomputed 2048-d features, DATASET.BOXES '36')
#   BOX_SOURCE [grid]           grid (GRID [4x4]) or detector (DETECTOR_WEIGHTS, DETECTOR [fasterrcnn_resnet50_fpn_v2])
#   RESNET_WEIGHTS              ResNet state dict of the features [a random ResNet-50, as the VQA demo: none
#                               ships offline; use the reference's resnet101-pt-vgbua-0000.model with a paper config]
#   PRETRAINED                  NETWORK.PARTIAL_PRETRAIN file [the pretraining demo's checkpoint when there is one
#                               (cfgs/pretrain/demo_e2e_cpu.yaml, bench/pretrain_gain.py), else none]
#   NPROC [2]                   training processes (1: no torch.distributed)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY=python3
CFG="${CFG:-cfgs/vqa/demo_cpu.yaml}"
BOX_SOURCE="${BOX_SOURCE:-grid}"
NPROC="${NPROC:-2}"
EXAMPLE=
if [ $# -ge 2 ] && [ -e "$1" ]; then
    OUT="${OUT:-data/own_vqa}"
    PHOTOS=$1 QA=$2
    shift 2
else
    OUT="${OUT:-data/own_vqa_example}"
    EXAMPLE=$OUT/example
    PHOTOS=$EXAMPLE/photos QA=$EXAMPLE/qa.json
fi
# One OUT per data set: TRAIN.AUTO_RESUME would take another data set's checkpoint (another answer vocabulary).
INPUTS="$(realpath -m "$PHOTOS")
$(realpath -m "$QA")"
if [ -f "$OUT/.inputs" ] && [ "$(cat "$OUT/.inputs")" != "$INPUTS" ]; then
    echo "error: OUT '$OUT' holds the data and run of other photos and questions ($(tr '\n' ' ' < "$OUT/.inputs" |
        sed 's/ $//')): move that folder away, or give this data set its own, e.g. OUT=${OUT%/}_2" >&2
    exit 2
fi
mkdir -p "$OUT"
echo "$INPUTS" > "$OUT/.inputs"
[ -z "$EXAMPLE" ] || "$PY" demo/own_images_example.py --out "$EXAMPLE"

# 2 first (it checks the QA file against the photos and makes the feature folder), then 1 into that folder.
FEATURES="$("$PY" -c 'import sys; sys.path.insert(0, "."); from vqa.data.vqa import FEATURE_FOLDERS, PRECOMPUTED_ROOT
print(sys.argv[1] + "/" + PRECOMPUTED_ROOT + "/" + FEATURE_FOLDERS["36"][0])' "$OUT")"
"$PY" tools/own_vqa_data.py --images "$PHOTOS" --qa "$QA" --out "$OUT"
ANSWERS=$OUT/vqa/answers_vqa.txt
"$PY" tools/build_vqa_answers.py --annotations "$OUT/vqa/v2_mscoco_train2014_annotations.json" --min-count 1 \
    --out "$ANSWERS"

# Step 1: boxes and features.
if [ -z "${RESNET_WEIGHTS:-}" ]; then
    "$PY" -c "import runpy, sys; runpy.run_path('bench/smoke_paper_config.py')['random_resnet_file'](sys.argv[1], 50)" \
        "$OUT/resnet50-random"
    RESNET_WEIGHTS=$OUT/resnet50-random-0000.model
fi
case "$BOX_SOURCE" in
    grid) BOXES=(--box-source grid --grid "${GRID:-4x4}") ;;
    detector) : "${DETECTOR_WEIGHTS:?BOX_SOURCE=detector needs DETECTOR_WEIGHTS (data/PREPARE_DATA.md)}"
              BOXES=(--box-source detector --detector "${DETECTOR:-fasterrcnn_resnet50_fpn_v2}"
                     --detector-weights "$DETECTOR_WEIGHTS") ;;
    *) echo "error: BOX_SOURCE must be grid or detector, got '$BOX_SOURCE'" >&2; exit 2 ;;
esac
"$PY" tools/extract_features.py "${BOXES[@]}" --image-root "$PHOTOS" --out "$FEATURES" --cfg "$CFG" \
    --weights "$RESNET_WEIGHTS"

# Step 3: fine-tuning from a pretraining checkpoint. Its image projection (obj_downsample) was made for other
# image features (the pretraining demo's ResNet-18): renamed away, it stays at its initial value here.
if [ -z "${PRETRAINED:-}" ]; then
    PRETRAINED="$(ls -t output/pretrain/vl-bert/demo_e2e_cpu/train_train/*-best.model 2>/dev/null | head -1 || true)"
fi
[ -n "$PRETRAINED" ] ||
    echo "note: no PRETRAINED checkpoint (and no pretraining demo run): fine-tuning from the language model alone"
DOWNSAMPLE=image_feature_extractor.obj_downsample
RENAMES="[\"$DOWNSAMPLE->pretrain_only.obj_downsample\", \"module.$DOWNSAMPLE->pretrain_only.obj_downsample\"]"
OPTS=(DATASET.DATASET_PATH "$OUT" DATASET.ANSWER_VOCAB_FILE "$ANSWERS"
      DATASET.ANSWER_VOCAB_SIZE "$(grep -c . "$ANSWERS")" DATASET.BOXES 36
      NETWORK.PARTIAL_PRETRAIN "$PRETRAINED" NETWORK.PARTIAL_PRETRAIN_PREFIX_CHANGES "$RENAMES" "$@")
if [ "$NPROC" -eq 1 ]; then
    ./scripts/nondist_run.sh vqa/train_end2end.py "$CFG" "$OUT" --opts "${OPTS[@]}"
else
    [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -gt 0 ] || export CUDA_VISIBLE_DEVICES=""
    ./scripts/dist_run_single.sh "$NPROC" vqa/train_end2end.py "$CFG" "$OUT" --opts "${OPTS[@]}"
fi

# Step 4: predictions for the test questions, from the run's effective config and best checkpoint.
RUN="$(dirname "$(ls -t "$OUT"/output/*/*/"$(basename "$CFG" .yaml)"/*/config.yaml | head -1)")"
CKPT="$(ls "$RUN"/*-best.model)"
"$PY" vqa/test.py --cfg "$RUN/config.yaml" --ckpt "$CKPT" --result-path "$RUN/test_result" --result-name own

# Step 5: attention maps of the fine-tuned checkpoint on the photos (pretrain/vis_attention_maps.py), a photo's
# first question as its caption, the step-1 boxes. The model runs end to end on the pixels: with the ResNet file
# of step 1 and $CFG's image keys, SCALES and pixel normalisation it computes the features of step 1, and the
# checkpoint gives its VL-BERT and obj_downsample; NETWORK.VLBERT, BERT_MODEL_NAME and IMAGE_FINAL_DIM come
# from the run's config.
ATTENTION=$RUN/attention
mkdir -p "$ATTENTION"
mapfile -t ATTENTION_OPTS < <("$PY" - "$QA" "$ATTENTION/captions.json" "$CFG" "$RUN/config.yaml" \
    "$RESNET_WEIGHTS" <<'PYTHON'
import json, re, sys
sys.path.insert(0, ".")
from common.data.region_features import image_id_from_name
from pretrain.task import TASK as PRETRAIN
from vqa.task import TASK as VQA
qa, captions, cfg_file, run_cfg_file, weights = sys.argv[1:]
first = {}
for e in json.load(open(qa)):
    first.setdefault(e["image"], e["question"].strip())
json.dump([{"image": image, "caption": question, "image_id": image_id_from_name(image)}
           for image, question in first.items()], open(captions, "w"), indent=1)
cfg, run = VQA.load_config(cfg_file), VQA.load_config(run_cfg_file)
attention = PRETRAIN.load_config("cfgs/pretrain/vis_attention_maps_demo.yaml").NETWORK.VLBERT
opts = {"NETWORK.IMAGE_FEAT_PRECOMPUTED": False, "DATASET.ADD_IMAGE_AS_A_BOX": run.DATASET.ADD_IMAGE_AS_A_BOX,
        "NETWORK.BERT_MODEL_NAME": run.NETWORK.BERT_MODEL_NAME, "NETWORK.IMAGE_FINAL_DIM": run.NETWORK.IMAGE_FINAL_DIM,
        "SCALES": cfg.SCALES, "NETWORK.PIXEL_MEANS": cfg.NETWORK.PIXEL_MEANS,
        "NETWORK.PIXEL_STDS": cfg.NETWORK.PIXEL_STDS}
keys = ["IMAGE_NUM_LAYERS", "IMAGE_C5_DILATED", "IMAGE_ROI_POOLED_SIZE", "IMAGE_STRIDE_IN_1x1"]
match = re.fullmatch(r"(.+)-(\d{4})\.model", weights)
if not match:
    sys.exit("error: RESNET_WEIGHTS '{}' is not named PREFIX-EPOCH.model (e.g. resnet101-pt-vgbua-0000.model), "
             "as NETWORK.IMAGE_PRETRAINED / IMAGE_PRETRAINED_EPOCH need".format(weights))
opts["NETWORK.IMAGE_PRETRAINED"], opts["NETWORK.IMAGE_PRETRAINED_EPOCH"] = match[1], int(match[2])
opts.update(("NETWORK." + k, cfg.NETWORK[k]) for k in keys)
opts.update(("NETWORK.VLBERT." + k, v) for k, v in run.NETWORK.VLBERT.items()
            if k in attention and k != "with_pooler" and v != attention[k])
for key, value in opts.items():
    print(key)
    print(json.dumps(list(value) if isinstance(value, tuple) else value))
PYTHON
)
[ "${#ATTENTION_OPTS[@]}" -gt 0 ] || { echo "error: step 5: no attention-map options" >&2; exit 1; }
"$PY" pretrain/vis_attention_maps.py --cfg cfgs/pretrain/vis_attention_maps_demo.yaml --ckpt "$CKPT" \
    --images "$PHOTOS" --captions "$ATTENTION/captions.json" --box-source features --box-file "$FEATURES" \
    --out "$ATTENTION" --opts "${ATTENTION_OPTS[@]}"

cat <<MSG

Own-images VQA done.
  data:         $OUT/vqa/ (questions, annotations, answers_vqa.txt), features in $FEATURES
  checkpoints:  $RUN/*.model
  predictions:  $RUN/test_result/own_vqa2_test2015.json ({"question_id", "answer"} per test question)
  attention:    $RUN/attention/attention_probs/<photo>.npy ([layers, heads, tokens, tokens]; tokens, boxes and
                caption in <photo>.json), maps in $RUN/attention/maps/<photo>/
  log + config: $RUN/*.log, $RUN/config.yaml
MSG
