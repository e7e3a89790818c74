"""run.json (common/diagnostics/run_record.py) through the tiny task's real entry point, a resume appending to it, and
tools/results_table.py over it; the paper's figures of docs/fidelity.md equal common/diagnostics/paper_results.py."""
import hashlib
import json
import os
import re
import subprocess

from common.diagnostics import run_record
from common.diagnostics.paper_results import PAPER_FIGURES
from tests.conftest import ROOT
from tests.faults import harness, tiny_task


def test_paper_table_in_docs_is_the_products():
    text = open(os.path.join(ROOT, "docs", "fidelity.md"), encoding="utf-8").read()
    rows = re.findall(r"^\| `cfgs/(\S+)\.yaml` \| (.+?) \| (\S+) \| ([0-9.]+) \|$", text, re.M)
    assert {name: (what, split, float(value)) for name, what, split, value in rows} == \
        {name: tuple(figure) for name, figure in PAPER_FIGURES.items()}
    for name in PAPER_FIGURES:  # each names a config of the release
        assert os.path.isfile(os.path.join(ROOT, "cfgs", name + ".yaml")), name


def test_git_info_of_a_checkout_a_changed_checkout_and_a_plain_folder(tmp_path, monkeypatch):
    """git_info on a fresh commit (clean), after a tracked file changed (dirty, the sha256 of ``git diff HEAD``),
    with a new untracked module (dirty) or only ignored files (clean), and in a folder that is no checkout (all
    None)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q"], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["add", "a.py"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "a"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setattr(run_record, "ROOT", str(repo))
    assert run_record.git_info() == {"commit": head, "dirty": False, "diff_sha256": None}
    (repo / "a.py").write_text("x = 2\n")
    diff = subprocess.run(git + ["diff", "HEAD"], capture_output=True, check=True).stdout
    assert run_record.git_info() == {"commit": head, "dirty": True, "diff_sha256": hashlib.sha256(diff).hexdigest()}
    # a new module git does not ignore: dirty, and its path and contents enter the hash
    (repo / "a.py").write_text("x = 1\n")
    (repo / "new_loss.py").write_text("y = 1\n")
    untracked = hashlib.sha256(b"\0new_loss.py\0" + b"6\0" + b"y = 1\n").hexdigest()  # path, size, contents
    assert run_record.git_info() == {"commit": head, "dirty": True, "diff_sha256": untracked}
    (repo / ".gitignore").write_text("output/\nnew_loss.py\n.gitignore\n")
    (repo / "output").mkdir()
    (repo / "output" / "run.json").write_text("{}")  # an ignored run folder leaves the checkout clean
    assert run_record.git_info() == {"commit": head, "dirty": False, "diff_sha256": None}
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.setattr(run_record, "ROOT", str(plain))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no checkout above tmp_path is found either
    assert run_record.git_info() == {"commit": None, "dirty": None, "diff_sha256": None}


def _sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_run_json_written_resumed_and_tabled(tmp_path, capsys):
    """A 2-epoch run, then the same run resumed to 3 epochs: one record, the resume's epoch appended and the first
    launch kept; every key holds this machine's values; results_table prints the best Acc, the paper's VCR Q->A
    figure for the config's name and the GPU-hours of the 3 epochs."""
    cfg_dir = tmp_path / "vcr"  # named like a paper config, so the table finds its paper figure
    cfg_dir.mkdir()
    cfg = str(cfg_dir / "base_q2a_4x16G_fp32.yaml")
    os.rename(tiny_task.write_config(cfg_dir), cfg)
    folder = os.path.join(str(tmp_path), "output", "base_q2a_4x16G_fp32", "train_train")
    assert harness.run_here(cfg, tmp_path, opts=["TRAIN.END_EPOCH", 2]) == 0
    first = json.load(open(os.path.join(folder, "run.json")))
    assert [e["epoch"] for e in first["epochs"]] == [0, 1] and first["launches"] == []
    assert harness.run_here(cfg, tmp_path, opts=["TRAIN.END_EPOCH", 3]) == 0
    record = json.load(open(os.path.join(folder, "run.json")))

    assert {"command", "git", "env", "world_size", "strategy", "config_sha256", "seeds", "data", "epochs"} <= set(record)
    # CI runs on a copy of the tree without .git: there the record says so with None (test_git_info covers both)
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head:
        assert record["git"]["commit"] == head and isinstance(record["git"]["dirty"], bool)
    else:
        assert record["git"] == {"commit": None, "dirty": None, "diff_sha256": None}
    assert record["env"]["torch"] == __import__("torch").__version__ and record["env"]["devices"]["count"] == 1
    assert (record["world_size"], record["strategy"], record["seeds"]) == (1, "single", {"RNG_SEED": 7, "per_rank": [7]})
    assert record["config_sha256"] == _sha256(os.path.join(folder, "config.yaml"))
    (data,) = record["data"]  # the tiny task's data folder holds its config file only
    assert data["path"] == cfg and data["size"] == os.path.getsize(cfg) and data["sha256"] == _sha256(cfg)
    # the resume appended epoch 2 to the first launch's epochs, which stay as they were
    assert record["epochs"][:2] == first["epochs"] and [e["epoch"] for e in record["epochs"]] == [0, 1, 2]
    for e in record["epochs"]:
        assert set(e["metrics"]) == {"Acc"} and e["wall_s"] > 0 and e["samples_per_s"] > 0
    (launch,) = record["launches"]
    assert launch["config_sha256"] == first["config_sha256"] != record["config_sha256"]  # END_EPOCH changed

    capsys.readouterr()
    tool = __import__("runpy").run_path(os.path.join(ROOT, "tools", "results_table.py"))
    assert tool["main"]([folder]) == 0
    lines = capsys.readouterr().out.splitlines()
    best = max(e["metrics"]["Acc"] for e in record["epochs"])
    epoch = min(e["epoch"] for e in record["epochs"] if e["metrics"]["Acc"] == best)
    hours = sum(e["wall_s"] for e in record["epochs"]) / 3600
    assert lines[0] == "| config | task metric (best val, %) | paper (%) | GPU-hours |"
    assert lines[2] == "| vcr/base_q2a_4x16G_fp32 | Acc {:.2f} (epoch {}) | 73.80 (VCR Q->A accuracy, val) | " \
                       "{:.3f} (cpu) |".format(100 * best, epoch, hours)


def test_data_files_of_a_vqa_layout_folder(tmp_path, monkeypatch):
    """Every annotation under the data folder, nested ones too, with its sha256; a file of HASH_LIMIT bytes or
    more with size and mtime only; a folder of images one entry with its count; a second record reuses the
    first's hashes (nothing read again)."""
    from common.task import Input

    coco = tmp_path / "coco"
    (coco / "vqa").mkdir(parents=True)
    (coco / "vqa" / "v2_OpenEnded_mscoco_train2014_questions.json").write_text('{"questions": []}')
    (coco / "vgbua_res101_precomputed").mkdir()
    (coco / "vgbua_res101_precomputed" / "index.txt").write_text("COCO_train2014_000000000009.jpg\n")
    images = coco / "train2014"
    images.mkdir()
    for i in range(run_record.MAX_FOLDER_FILES + 1):
        (images / "COCO_train2014_{:012d}.jpg".format(i)).write_bytes(b"")
    with open(coco / "train2014.zip", "wb") as f:  # sparse: HASH_LIMIT bytes without writing them
        f.truncate(run_record.HASH_LIMIT)
    entries = run_record.data_files([Input("DATASET.DATASET_PATH", "data folder", str(coco), is_dir=True)])
    by_path = {os.path.relpath(e["path"], str(coco)): e for e in entries}
    assert set(by_path) == {"vqa/v2_OpenEnded_mscoco_train2014_questions.json", "vgbua_res101_precomputed/index.txt",
                            "train2014", "train2014.zip"}
    questions = coco / "vqa" / "v2_OpenEnded_mscoco_train2014_questions.json"
    assert by_path["vqa/v2_OpenEnded_mscoco_train2014_questions.json"]["sha256"] == _sha256(str(questions))
    assert by_path["train2014"] == {"key": "DATASET.DATASET_PATH", "path": str(images),
                                    "files": run_record.MAX_FOLDER_FILES + 1}
    assert by_path["train2014.zip"]["size"] == run_record.HASH_LIMIT and by_path["train2014.zip"]["sha256"] is None

    read = []
    monkeypatch.setattr(run_record, "sha256_file", lambda path: read.append(path))
    again = run_record.data_files([Input("DATASET.DATASET_PATH", "data folder", str(coco), is_dir=True)], entries)
    assert again == entries and read == []
