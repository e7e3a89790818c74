#!/usr/bin/env bash
# Attention maps of the VCR demo checkpoint on the demo photographs (scripts/run_demo.sh attention, which
# sets up .venv and the MiniLM link first). Trains the VCR demo first when its checkpoint is missing
# (scripts/run_demo.sh). Each photograph gets a caption (below) and its demo boxes (the VCR metadata's
# objects, through the 'file' box source), plus the whole image as region 0; the maps are drawn with
# cfgs/pretrain/vis_attention_maps_demo.yaml (the demo's network under ResNetVLBERTForAttentionVis).
#   usage: demo/run_demo_attention.sh [extra pretrain/vis_attention_maps.py args, e.g. --max-items 2]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
CKPT=output/vl-bert/vcr/demo_q2a_cpu/vcr1images_train/vl-bert_demo_q2a_res18-best.model
PHOTOS=data/demo/vcr1images/real
DATA=data/demo_attention
OUT=output/vl-bert/pretrain/vis_attention_maps_demo/demo_attention

if [ ! -f "$CKPT" ]; then
    "$ROOT/scripts/run_demo.sh"
fi
mkdir -p "$DATA"
cat > "$DATA/captions.json" <<'JSON'
[{"image": "astronaut.jpg", "caption": "an astronaut in a space suit next to a flag and a helmet"},
 {"image": "camera.jpg", "caption": "a man takes photos with a camera on a tripod in front of a building"},
 {"image": "chelsea.jpg", "caption": "a cat with yellow green eyes and a pink nose"},
 {"image": "clock.jpg", "caption": "an old clock on a wall"},
 {"image": "coffee.jpg", "caption": "a cup of coffee with a spoon on a saucer on a table"},
 {"image": "coins.jpg", "caption": "old coins in rows"},
 {"image": "hubble.jpg", "caption": "galaxies and a bright star in deep space"},
 {"image": "ihc.jpg", "caption": "glands in stained tissue under a microscope"},
 {"image": "motorcycle.jpg", "caption": "a motorcycle and a bicycle next to a bench and a box"},
 {"image": "rocket.jpg", "caption": "a rocket on the launch pad between towers"},
 {"image": "text.jpg", "caption": "writing on a sheet of paper"}]
JSON
# The boxes of each photograph's VCR metadata, in the boxes JSON of tools/extract_features.py --boxes.
"$PY" - "$PHOTOS" "$DATA/boxes.json" <<'PYTHON'
import json, os, sys
photos, out = sys.argv[1:]
names = sorted(n[:-4] for n in os.listdir(photos) if n.endswith(".jpg"))
entries = [{"image_id": n, "image": n + ".jpg",
            "boxes": [b[:4] for b in json.load(open(os.path.join(photos, n + ".json")))["boxes"]]} for n in names]
json.dump(entries, open(out, "w"))
PYTHON

"$PY" pretrain/vis_attention_maps.py --cfg cfgs/pretrain/vis_attention_maps_demo.yaml --ckpt "$CKPT" \
    --images "$PHOTOS" --captions "$DATA/captions.json" --box-source file --box-file "$DATA/boxes.json" \
    --out "$OUT" "$@"

cat <<MSG

Attention demo done.
  raw attention: $OUT/attention_probs/<photo>.npy  ([layers, heads, tokens, tokens]; tokens and boxes in <photo>.json)
  maps:          $OUT/maps/<photo>/layerNN_word_to_region.png, layerNN_region_to_word.png, summary_*.png
MSG
