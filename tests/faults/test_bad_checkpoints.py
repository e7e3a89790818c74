"""Corrupt checkpoints under TRAIN.AUTO_RESUME: a truncated newest file is skipped with a warning and the
run falls back to the previous one (ending in the uninterrupted state); when no checkpoint reads, the
run stops with one error and leaves every file as it was."""
import os
import re

import torch

from tests.faults import harness, tiny_task


def file_bytes(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))
            if name.endswith(".model")}


def test_truncated_newest_checkpoint_falls_back_and_says_so(tiny_cfg, clean_state, tmp_path, capsys):
    folder = harness.out_dir(tmp_path)
    assert harness.run_here(tiny_cfg, tmp_path, opts=["TRAIN.END_EPOCH", 2]) == 0  # epochs 0 and 1
    newest = os.path.join(folder, "tiny-0001.model")
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)
    capsys.readouterr()

    assert harness.run_here(tiny_cfg, tmp_path) == 0  # 3 epochs: resumes, trains epoch 2
    out = capsys.readouterr().out
    warning = re.findall(r"skipping unreadable checkpoint.*", out)
    assert len(warning) == 1 and re.match(
        r"skipping unreadable checkpoint, falling back to the previous one: {} is not a readable checkpoint \("
        .format(re.escape(newest)), warning[0]), warning
    assert "Resumed from {}: epoch 1, batch 16".format(os.path.join(folder, "tiny-0001-b0000016.model")) in out
    harness.assert_same(harness.training_state(os.path.join(folder, harness.FINAL)), clean_state)


def test_no_readable_checkpoint_stops_without_overwriting(tiny_cfg, tmp_path, capsys):
    folder = harness.out_dir(tmp_path)
    assert harness.run_here(tiny_cfg, tmp_path, opts=["TRAIN.END_EPOCH", 1]) == 0
    names = harness.checkpoint_names(tmp_path)
    assert names == ["tiny-0000-b0000012.model", "tiny-0000-b0000016.model", "tiny-0000.model", "tiny-best.model"]
    for i, name in enumerate(names):  # each broken in another way
        with open(os.path.join(folder, name), "r+b") as f:
            [lambda: f.truncate(0), lambda: f.truncate(100), lambda: f.write(b"garbage!"), lambda: None][i]()
    before = file_bytes(folder)
    capsys.readouterr()

    assert harness.run_here(tiny_cfg, tmp_path) == 2
    err = capsys.readouterr().err
    assert err == ("error: none of the 3 checkpoints of this run in {} can be read (tiny-0000.model, "
                   "tiny-0000-b0000016.model, tiny-0000-b0000012.model); nothing was overwritten: restore a good "
                   "copy, or move them away to train from scratch\n".format(os.path.abspath(folder)))
    assert file_bytes(folder) == before


def test_another_models_run_folder_is_refused_naming_the_folder(tiny_cfg, tmp_path, monkeypatch, capsys):
    """TRAIN.AUTO_RESUME in the folder of a run of another model (here 3 classes instead of 2, as another data
    set's answer vocabulary gives): one error with the mismatches, naming the folder to move, files untouched."""
    folder = harness.out_dir(tmp_path)
    assert harness.run_here(tiny_cfg, tmp_path, opts=["TRAIN.END_EPOCH", 1]) == 0
    before = file_bytes(folder)
    real_init = tiny_task.TinyNet.__init__

    def three_classes(self, config):
        real_init(self, config)
        self.mlp[3] = torch.nn.Linear(512, 3)
    monkeypatch.setattr(tiny_task.TinyNet, "__init__", three_classes)
    capsys.readouterr()

    assert harness.run_here(tiny_cfg, tmp_path) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: {} does not fit the model:\n".format(os.path.join(folder, "tiny-0000.model"))), err
    assert "  shape mismatches: ['mlp.3.weight: (2, 512) in checkpoint, (3, 512) in model'" in err
    assert err.endswith("\nThe run folder {} holds a run of another model (another config or data set): move it "
                        "away, or give this run its own folder (--model-dir, OUTPUT_PATH)\n".format(folder)), err
    assert file_bytes(folder) == before
