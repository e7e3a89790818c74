"""Convert Conceptual Captions between the reference's layout and webdataset / img2dataset tar shards.

    python tools/convert_cc_shards.py to-shards --data DIR --out OUT [--image-set train] [--storage folder|zip|lmdb] [--per-shard N]
    python tools/convert_cc_shards.py from-shards --shards 'OUT/train-{00000..00003}.tar' --out DIR [--image-set S]
    python tools/convert_cc_shards.py index --shards 'cc3m/{00000..00331}.tar' [--workers 8]

``to-shards`` reads ``{DIR}/{set}_frcnn.json`` and its images and detector files (``pretrain/data/
conceptual_captions.py``; ``--storage`` reads its ``.zip@/`` paths as ``DATASET.ZIP_MODE`` / ``LMDB_MODE`` do)
and writes ``{OUT}/{set}-{00000..}.tar``, one sample per caption line, in line order: ``{key}.jpg`` (the
image's bytes, its extension kept), ``{key}.txt`` (the caption tokens joined by spaces) and ``{key}.json`` (the detector file's fields, plus ``caption``, the token list,
and ``cc_image`` / ``cc_frcnn``, the files' paths relative to DIR, for the way back). It prints the config lines
of ``DATASET.DATASET: 'cc_shards'``.

``from-shards`` writes the reference's layout from shards that carry detector output (``{key}.json`` with
``boxes``; ``{key}.npy`` features go back into its base64 ``features``): ``{DIR}/{set}_frcnn.json`` and the files
at their ``cc_image`` / ``cc_frcnn`` paths, or ``{set}_image/{key}.{ext}`` and ``{set}_frcnn/{key}.json``; read it
with ``DATASET.ZIP_MODE: false``.

``index`` writes the ``.idx.json`` index of each shard next to it in parallel worker processes (a run indexes
shards without one itself, one process each, at about 0.1 ms of CPU per tar member).
"""
import argparse
import io
import json
import os
import sys
from multiprocessing import Pool

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import run_main  # noqa: E402
from common.data.loading import load_json, parse_json  # noqa: E402
from common.data.region_features import encode_array  # noqa: E402
from common.data.tar_shards import IMAGE_EXTS, ShardIndex, cached_index, expand_shards, write_shards  # noqa: E402
from common.data.storage import STORAGES, read_bytes  # noqa: E402
from common.errors import UserInputError  # noqa: E402
from pretrain.data.conceptual_captions import INDEX_FILE, local_path, read_caption_index  # noqa: E402

# Fields of the shard JSON that are not the detector file's.
OWN_FIELDS = ("caption", "cc_image", "cc_frcnn")


def _samples(data, image_set, storage):
    """Shard samples (dicts of bytes) of the caption index of ``image_set`` under ``data``."""
    records = read_caption_index(os.path.join(data, INDEX_FILE.format(image_set)), data, storage)
    for i, record in enumerate(records):
        ext = os.path.splitext(record.image)[1][1:].lower()
        if ext not in IMAGE_EXTS:
            raise UserInputError("{} line {}: image '{}' is not one of {}".format(
                INDEX_FILE.format(image_set), record.line, record.image, ", ".join(IMAGE_EXTS)))
        meta = dict(load_json(record.frcnn), caption=record.caption, cc_image=os.path.relpath(record.image, data),
                    cc_frcnn=os.path.relpath(record.frcnn, data))
        yield {"__key__": "{:09d}".format(i), ext: read_bytes(record.image),
               "txt": " ".join(record.caption).encode("utf-8"), "json": json.dumps(meta).encode("utf-8")}


def to_shards(data, image_set, out, per_shard=1000, storage="folder"):
    """Write the shards of ``image_set``; returns their brace pattern relative to ``out`` (None: no caption)."""
    return write_shards(_samples(data, image_set, storage), os.path.join(out, image_set), per_shard)


def from_shards(pattern, out, image_set="train", root=""):
    """Write the reference's layout of ``image_set`` under ``out`` from the shards of ``pattern``; returns the
    number of captions.

    Raises:
        UserInputError: a sample without a caption or detector output, or with an undecodable member.
    """
    index = ShardIndex.build(expand_shards(pattern, root, "--shards"), cache=False)
    lines = []
    for i in range(len(index)):
        key = index.keys[i].decode("utf-8")
        if not index.has(i, "json") or not index.has(i, "image"):
            raise UserInputError("{}: needs an image and a .json member with the detector output".format(
                index.name(i)))
        meta = parse_json(index.read(i, "json"), index.name(i, "json"))
        if not isinstance(meta, dict) or "boxes" not in meta:
            raise UserInputError("{}: no detector output ('boxes')".format(index.name(i, "json")))
        caption = (index.read(i, "txt").decode("utf-8").split() if index.has(i, "txt")
                   else meta.get("caption"))
        if isinstance(caption, str):
            caption = caption.split()
        if not caption:
            raise UserInputError("{}: no caption".format(index.name(i)))
        image = meta.get("cc_image") or "{}_image/{}.{}".format(image_set, key, index.image_ext(i))
        frcnn = meta.get("cc_frcnn") or "{}_frcnn/{}.json".format(image_set, key)
        detector = {k: v for k, v in meta.items() if k not in OWN_FIELDS}
        if index.has(i, "npy"):
            detector["features"] = encode_array(np.load(io.BytesIO(index.read(i, "npy")), allow_pickle=False))
        for name, data in ((image, index.read(i, "image")), (frcnn, json.dumps(detector).encode("utf-8"))):
            path = local_path(out, name, "folder")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        lines.append(json.dumps({"image": image, "caption": caption, "frcnn": frcnn}) + "\n")
    with open(os.path.join(out, INDEX_FILE.format(image_set)), "w") as f:
        f.writelines(lines)
    return len(lines)


def index(pattern, workers=1):
    """Write the index cache of every shard of ``pattern`` (``common.data.tar_shards.cached_index``); returns the
    number of samples."""
    paths = expand_shards(pattern, "", "--shards")
    with Pool(max(1, min(workers, len(paths)))) as pool:
        return sum(len(samples) for samples in pool.imap(cached_index, paths))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    to = sub.add_parser("to-shards", help="reference layout -> tar shards")
    to.add_argument("--data", required=True, help="DATASET_PATH of the reference layout")
    to.add_argument("--image-set", default="train", help="the index {set}_frcnn.json to convert")
    to.add_argument("--storage", choices=STORAGES, default="folder",
                    help="read '.zip@/' paths from folders, the archives (DATASET.ZIP_MODE) or LMDB stores (LMDB_MODE)")
    to.add_argument("--out", required=True, help="folder of the shards")
    to.add_argument("--per-shard", type=int, default=1000, help="samples per shard")
    back = sub.add_parser("from-shards", help="tar shards -> reference layout")
    back.add_argument("--shards", required=True, help="brace pattern of the shard files")
    back.add_argument("--out", required=True, help="DATASET_PATH to write")
    back.add_argument("--image-set", default="train", help="the index {set}_frcnn.json to write")
    ix = sub.add_parser("index", help="write the shards' index caches")
    ix.add_argument("--shards", required=True, help="brace pattern of the shard files")
    ix.add_argument("--workers", type=int, default=os.cpu_count(), help="processes")
    args = parser.parse_args(argv)
    if args.command == "to-shards":
        if args.per_shard < 1:
            parser.error("--per-shard must be >= 1")
        pattern = to_shards(args.data, args.image_set, args.out, args.per_shard, args.storage)
        if pattern is None:
            raise UserInputError("{}: no caption".format(os.path.join(args.data, INDEX_FILE.format(args.image_set))))
        print("DATASET:\n  DATASET: cc_shards\n  DATASET_PATH: '{}'\n  {}_SHARDS: '{}'".format(
            args.out, args.image_set.upper() if args.image_set in ("train", "val", "test") else "TRAIN", pattern))
    elif args.command == "index":
        print("{} samples indexed".format(index(args.shards, args.workers)))
    else:
        count = from_shards(args.shards, args.out, args.image_set)
        print("{} captions written to {}".format(count, os.path.join(args.out, INDEX_FILE.format(args.image_set))))


if __name__ == "__main__":
    run_main(main)
