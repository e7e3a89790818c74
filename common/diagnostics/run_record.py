"""``run.json``: what produced a run folder (code, environment, config, data) and what each epoch gave.

Written atomically (:func:`common.fileio.safe_write.atomic_write`) by rank 0 when training starts and after every
epoch (with its validation), by the :class:`RunRecord` hook. Keys::

    command        the process's command line
    git            {commit, dirty, diff_sha256} of the code's checkout (None values outside a git checkout)
    env            {python, torch, cuda, cudnn, devices: {type, count, names}}
    world_size     processes of this launch
    strategy       how the processes train: 'single' (one process, no wrapper), 'ddp' or 'fsdp' (TRAIN.STRATEGY)
    config_file    the --cfg file; config_sha256: sha256 of the effective config.yaml in the run folder
    seeds          {RNG_SEED, per_rank: RNG_SEED + rank (None when RNG_SEED < 0: unseeded)}
    host_metric    the validation metric the run keeps the best checkpoint by
    data           [{key, path, size, mtime, sha256}]: each input file the config names, and every file under
                   each data folder it names (annotations, feature indexes, image archives); sha256 only for
                   files under 100 MB (None above); a subfolder of over MAX_FOLDER_FILES files (images,
                   per-image features) is one entry {key, path, files}
    epochs         [{epoch, metrics, wall_s, samples_per_s, world_size}], one per finished epoch; metrics are
                   the validation values (empty when the epoch was not validated)
    trackers       {name: {run_id, where}}: the MLflow / W&B run this run reports to (REPORT_TO, docs/tracking.md)
    launches       earlier launches of the same run folder (resumes): their command, git, env, world_size,
                   strategy, config_sha256 and started time

A resumed run reads the record, moves its launch header under ``launches``, keeps the epochs before the one it
resumes at and appends its own (:func:`load_record`). ``tools/results_table.py`` reads these files.
"""
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from typing import Optional

import torch

from common.fileio.safe_write import atomic_write
from common.hooks.base import HookBase

FILE = "run.json"
HASH_LIMIT = 100 * 2 ** 20  # bytes: larger files get size and mtime only
MAX_FOLDER_FILES = 200  # a subfolder with more files (images, per-image features) is one entry
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = ("command", "git", "env", "world_size", "strategy", "config_file", "config_sha256", "seeds",
          "host_metric", "data", "started")


def sha256_file(path: str) -> str:
    """Hex sha256 of the file ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(2 ** 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _git(*args) -> Optional[str]:
    try:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, check=True, timeout=30).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return None


# An untracked file's contents enter diff_sha256 up to this size (a new module, a changed config); a larger one
# (a data file kept in the checkout) by its path and size only, so that the record does not read it.
MAX_UNTRACKED_HASHED = 1 << 20


def git_info() -> dict:
    """``{commit, dirty, diff_sha256}`` of the code's checkout: HEAD, whether tracked files differ from it or
    files git neither tracks nor ignores are there (a new module), and the sha256 of ``git diff HEAD`` followed by
    each such file's path and contents (its size alone above :data:`MAX_UNTRACKED_HASHED`); None each outside a
    git checkout or without git."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "diff_sha256": None}
    diff = (_git("diff", "HEAD") or "").encode()
    untracked = sorted(filter(None, (_git("ls-files", "--others", "--exclude-standard", "-z") or "").split("\0")))
    if not diff and not untracked:
        return {"commit": commit.strip(), "dirty": False, "diff_sha256": None}
    digest = hashlib.sha256(diff)
    for name in untracked:
        path = os.path.join(ROOT, name)
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        digest.update("\0{}\0{}\0".format(name, size).encode())
        if 0 < size <= MAX_UNTRACKED_HASHED:
            with open(path, "rb") as f:
                digest.update(f.read())
    return {"commit": commit.strip(), "dirty": True, "diff_sha256": digest.hexdigest()}


def env_info(device: torch.device) -> dict:
    """Python, torch, CUDA and cuDNN versions and the devices of this machine's kind (``device.type``)."""
    if device.type == "cuda":
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        names = [platform.processor() or platform.machine()]
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "devices": {"type": device.type, "count": len(names), "names": names}}


def _count_files(folder: str) -> int:
    """Files in ``folder`` and its subfolders."""
    return sum(len(files) for _, _, files in os.walk(folder))


def _folder_paths(folder: str):
    """``(files, bulk)`` under ``folder``: the files to list one by one (annotations, feature indexes, archives),
    and ``[(subfolder, file count)]`` of the subfolders holding more than :data:`MAX_FOLDER_FILES` files (images,
    per-image features), each recorded as one entry so that a run does not read every photo at start."""
    files, bulk = [], []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            files.append(path)
        elif os.path.isdir(path):
            count = _count_files(path)
            if count > MAX_FOLDER_FILES:
                bulk.append((path, count))
            else:
                more, more_bulk = _folder_paths(path)
                files += more
                bulk += more_bulk
    return files, bulk


def data_files(inputs, known=()) -> list:
    """``[{key, path, size, mtime, sha256}]`` of the files the :class:`common.task.Input` list ``inputs`` names: a
    file itself; a folder every file under it, except that a subfolder of more than :data:`MAX_FOLDER_FILES` files
    is one entry ``{key, path, files}`` (its file count). ``sha256`` is None for files of :data:`HASH_LIMIT` bytes
    or more. ``known``: entries of an earlier record; a file with the same path, size and mtime keeps its sha256
    without being read again."""
    cache = {(d["path"], d["size"], d["mtime"]): d["sha256"] for d in known if "sha256" in d}
    entries = []
    for item in inputs:
        bulk = []
        if item.is_dir:
            if not os.path.isdir(item.path):
                continue
            paths, bulk = _folder_paths(item.path)
        else:
            paths = [item.path] if os.path.isfile(item.path) else []
        for path in paths:
            path = os.path.abspath(path)
            stat = os.stat(path)
            key = (path, stat.st_size, stat.st_mtime)
            digest = cache.get(key) or (sha256_file(path) if stat.st_size < HASH_LIMIT else None)
            entries.append({"key": item.key, "path": path, "size": stat.st_size, "mtime": stat.st_mtime,
                            "sha256": digest})
        entries += [{"key": item.key, "path": os.path.abspath(path), "files": count} for path, count in bulk]
    return entries


def load_record(folder: str) -> Optional[dict]:
    """The ``run.json`` of ``folder``, or None when there is none (or it is not a JSON object)."""
    try:
        with open(os.path.join(folder, FILE), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_record(folder: str, record: dict) -> None:
    """Write ``record`` to ``folder/run.json`` atomically."""
    text = json.dumps(record, indent=1, sort_keys=False)
    atomic_write(os.path.join(folder, FILE), lambda f: f.write(text), binary=False, size_hint=len(text))


def strategy_name(world_size: int, sharded: bool) -> str:
    """What run.json calls the way a launch trains: 'fsdp' (parameters sharded over the process group, one
    process included), 'ddp' (a DistributedDataParallel over ``world_size`` > 1 processes), else 'single'."""
    if sharded:
        return "fsdp"
    return "ddp" if world_size > 1 else "single"


class RunRecord(HookBase):
    """Writes ``run.json`` (see the module docstring) on rank 0: at ``before_train`` and at every ``after_epoch``
    (put it after the validation hook, so the epoch's metrics are there).

    Args:
        folder: the run folder (holds the effective ``config.yaml``).
        cfg: the frozen config.
        cfg_path: the --cfg file.
        inputs: the task's :class:`common.task.Input` list (``task.inputs(cfg)``).
        validation: the :class:`common.hooks.validation_monitor.ValidationMonitor` (``validated``, ``values``,
            ``host_metric_name``).
        world_size, device: of this launch.
        strategy: 'single', 'ddp' or 'fsdp' (:func:`strategy_name`).
    """

    def __init__(self, folder, cfg, cfg_path, inputs, validation, world_size: int, device: torch.device,
                 strategy: str):
        self.folder, self.cfg, self.cfg_path, self.inputs = folder, cfg, cfg_path, inputs
        self.validation, self.world_size, self.device, self.strategy = validation, world_size, device, strategy
        self.record = None
        self.epoch_start = self.mark = None

    def _header(self, earlier: Optional[dict]) -> dict:
        seed = self.cfg.RNG_SEED
        config = os.path.join(self.folder, "config.yaml")
        return {"command": " ".join(sys.argv), "git": git_info(), "env": env_info(self.device),
                "world_size": self.world_size, "strategy": self.strategy, "config_file": self.cfg_path,
                "config_sha256": sha256_file(config) if os.path.isfile(config) else None,
                "seeds": {"RNG_SEED": seed, "per_rank": [seed + r for r in range(self.world_size)] if seed >= 0 else None},
                "host_metric": self.validation.host_metric_name,
                "data": data_files(self.inputs, (earlier or {}).get("data", ())),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    def before_train(self, ctx):
        if not ctx.is_main:
            return
        earlier = load_record(self.folder)
        record = self._header(earlier)
        record["epochs"], record["launches"] = [], []
        if earlier is not None:  # a resumed run: the earlier launches stay, with the epochs they finished
            record["launches"] = earlier.get("launches", []) + [
                {k: earlier[k] for k in HEADER if k in earlier and k != "data"}]
            record["epochs"] = [e for e in earlier.get("epochs", []) if e.get("epoch", 0) < ctx.state["epoch"]]
        self.record = record
        write_record(self.folder, record)

    def set_tracker(self, name: str, info: dict) -> None:
        """Note the run of tracker ``name`` (``{run_id, where}``) under ``trackers`` and rewrite run.json (rank 0,
        after :meth:`before_train`)."""
        self.record.setdefault("trackers", {})[name] = info
        write_record(self.folder, self.record)

    def before_epoch(self, ctx):
        self.epoch_start, self.mark = time.perf_counter(), ctx.record.mark()

    def after_epoch(self, ctx):
        if not ctx.is_main or self.record is None:
            return
        metrics = dict(self.validation.values) if self.validation.validated else {}
        self.record["epochs"].append({"epoch": ctx.epoch, "metrics": {k: float(v) for k, v in metrics.items()},
                                      "wall_s": round(time.perf_counter() - self.epoch_start, 3),
                                      "samples_per_s": round(ctx.record.samples_per_s(self.mark), 3),
                                      "world_size": self.world_size})
        write_record(self.folder, self.record)
