"""Read every item of a config's data sets before a long run, and list the ones that would stop it.

    python tools/check_data.py --cfg CFG [--task TASK] [--split train val test] [--json REPORT] [--decode]
                                 [--opts KEY VALUE ...]

The data sets are built through the task as ``<task>/train_end2end.py`` builds them (the config read with
its checks, the inputs it names checked, one data set per ``DATASET`` entry), then each item is read: a
data set with a ``check_item(index)`` method (VCR) reads the metadata, the image's header (size, EXIF
orientation), the boxes against that size and the texts through the tokenizer, without decoding pixels;
other data sets, or all with ``--decode``, read each item in full (``dataset[index]``, the transforms of
that split included). A bar per split (stderr), then a summary per split and each bad item with its file
and line (``item_source(index)`` of the data set: the jsonl line, or the index in a JSON list) and the
reason; warnings (an image used in its stored orientation, a size unlike the metadata's) are listed too.
``--json REPORT`` writes all of it. Exit code 0 when every item reads, 2 when some do not (or the config,
an input or a data set is bad: one ``error:`` line).

The task is ``--task`` or, by default, the name of the config's folder (``cfgs/vcr/x.yaml``: vcr).
"""
import argparse
import importlib
import json
import os
import sys
import time
import warnings

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import run_main  # noqa: E402
from common.data.build import MODES  # noqa: E402
from common.data.multitask import dataset_configs  # noqa: E402
from common.engine import check_inputs  # noqa: E402
from common.errors import UserInputError  # noqa: E402
from common.task import TASKS  # noqa: E402

TASK_PACKAGES = ("vcr", "vqa", "refcoco", "pretrain", "cls")
# What bad data raises while an item is read (a missing file, a bad value, type or index in a record).
DATA_ERRORS = (ValueError, OSError, LookupError, TypeError)
LISTED = 20  # bad items and warnings printed per split (the JSON report has all)


def parse_args(argv=None):
    parser = argparse.ArgumentParser("Read every item of a config's data sets and list the bad ones")
    parser.add_argument("--cfg", required=True, help="the YAML config of the run")
    parser.add_argument("--task", choices=TASK_PACKAGES, help="the task (default: the config's folder name)")
    parser.add_argument("--split", nargs="+", choices=MODES, default=["train", "val"], help="splits to read")
    parser.add_argument("--json", dest="report", help="write every bad item and warning to this JSON file")
    parser.add_argument("--decode", action="store_true", help="read each item in full (pixels decoded, transforms "
                                                              "run) even where headers suffice")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    return parser.parse_args(argv)


def task_of(cfg_path, name=None):
    """The registered task ``name``, or the one named by the config's folder.

    Raises:
        UserInputError: no name given and the folder is not a task's.
    """
    if name is None:
        name = os.path.basename(os.path.dirname(os.path.abspath(cfg_path)))
        if name not in TASK_PACKAGES:
            raise UserInputError("--cfg {}: its folder '{}' is not a task's; give --task (one of {})".format(
                cfg_path, name, ", ".join(TASK_PACKAGES)))
    importlib.import_module(name + ".task")
    return TASKS.get(name)


def source_of(dataset, index):
    """Where item ``index`` is defined, from the data set's ``item_source(index) -> (file, position)``:
    ``{'file': ..., 'line': n}`` (a jsonl line, from 1) for an int position, else ``{'file': ..., **position}``
    (``{'index': n}`` in a JSON list, from 0; ``{'ref_id': .., 'sent_id': ..}``); ``{'item': index}`` without it."""
    where = getattr(dataset, "item_source", None)
    if where is None:
        return {"item": index}
    path, position = where(index)
    return {"file": path, "line": position} if isinstance(position, int) else {"file": path, **position}


def describe(source):
    """``FILE line N`` / ``FILE index N`` / ``item N`` for a :func:`source_of` dict (``data set`` for none)."""
    keys = [k for k in source if k not in ("file", "reason", "warning")]
    where = " ".join("{} {}".format(k, source[k]) for k in keys) or "data set"
    return "{} {}".format(source["file"], where) if "file" in source else where


def check_split(dataset, split, decode=False, progress=True):
    """Read every item of ``dataset``; returns the split's report dict (``items``, ``bad``, ``warnings``,
    ``seconds``; each bad item or warning with its source, ``reason`` / ``warning``)."""
    read = dataset.__getitem__ if decode or not hasattr(dataset, "check_item") else dataset.check_item
    bad, noted = [], []
    start = time.perf_counter()
    for index in tqdm(range(len(dataset)), desc="check " + split, unit="item", disable=not progress):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                read(index)
            except DATA_ERRORS as e:
                bad.append(dict(source_of(dataset, index), reason="{}: {}".format(type(e).__name__, e)))
        noted += [dict(source_of(dataset, index), warning="{}: {}".format(w.category.__name__, w.message))
                  for w in caught]
    return {"items": len(dataset), "bad": bad, "warnings": noted, "seconds": time.perf_counter() - start,
            "read": "in full" if read != getattr(dataset, "check_item", None) else "headers"}


def check_data(task, cfg, splits, decode=False, progress=True):
    """The report of every split (one entry per ``DATASET`` list entry: ``train``, ``train[1]``, ...); a data set
    that cannot be built is one bad entry naming the reason."""
    report = {}
    for split in splits:
        subs = dataset_configs(cfg) if isinstance(cfg.DATASET, list) else [cfg]
        for k, sub in enumerate(subs):
            name = split if len(subs) == 1 else "{}[{}]".format(split, k)
            try:
                dataset = task.build_dataset(sub, split)
            except DATA_ERRORS as e:
                report[name] = {"items": 0, "bad": [{"reason": "{}: {}".format(type(e).__name__, e)}],
                                "warnings": [], "seconds": 0.0, "read": "not built"}
                continue
            report[name] = check_split(dataset, name, decode, progress)
    return report


def print_report(report):
    for name, split in report.items():
        seconds = split["seconds"]
        print("{}: {} items, {} bad, {} warnings; read ({}) in {:.1f} s{}".format(
            name, split["items"], len(split["bad"]), len(split["warnings"]), split["read"], seconds,
            ", {:.2f} s per 1000 items".format(1000 * seconds / split["items"]) if split["items"] else ""))
        for kind, entries, key in (("bad", split["bad"], "reason"), ("warning", split["warnings"], "warning")):
            for entry in entries[:LISTED]:
                print("  {} {}: {}".format(kind, describe(entry), entry[key]))
            if len(entries) > LISTED:
                print("  ... and {} more ({})".format(len(entries) - LISTED, kind))


def main(argv=None):
    """Check as the command line says; exit code 2 when an item is bad."""
    args = parse_args(argv)
    task = task_of(args.cfg, args.task)
    cfg = task.load_config(args.cfg, args.opts)
    task.check_config(cfg, args.cfg)
    check_inputs(task, cfg)
    report = check_data(task, cfg, args.split, args.decode)
    print_report(report)
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"config": args.cfg, "task": task.name, "splits": report}, f, indent=1)
    bad = sum(len(split["bad"]) for split in report.values())
    if bad:
        print("error: {} bad item(s); fix them (or their metadata) before training".format(bad), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run_main(main)
