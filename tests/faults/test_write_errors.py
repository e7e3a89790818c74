"""Disk full (ENOSPC) and a folder that refuses files (EACCES) while checkpoints are written, injected
into the checkpoint writer: one ``error:`` line naming the folder, the cause and the last good
checkpoint; that checkpoint intact; and, once the fault is gone, a resume from it that ends in the
uninterrupted run's state."""
import os
import re

import pytest

from tests.faults import harness

# Checkpoint files of epoch 0, in writing order: b4, b8, b12, b16, tiny-0000.model, tiny-best.model.
FAILING_FILE = 5


@pytest.mark.parametrize("kind, cause", [
    ("ENOSPC", r"no space left on the device \(needed about [\d.]+ kB, [\d.]+ MB free\)"),
    ("EACCES", r"the folder is not writable \(Permission denied\)"),
])
def test_write_failure_is_one_clear_error_and_resume_after_the_fix(kind, cause, tiny_cfg, clean_state, tmp_path,
                                                                   capsys, monkeypatch):
    folder = harness.out_dir(tmp_path)
    code = harness.run_here(tiny_cfg, tmp_path, monkeypatch, faults={"FAULT_SAVE_ERROR": "{}:{}".format(
        kind, FAILING_FILE)})
    err = capsys.readouterr().err
    assert code == 2
    assert re.fullmatch(
        r"error: cannot write tiny-0000\.model in folder {}: {}; the last good checkpoint, tiny-0000-b0000016\.model, "
        r"is intact: free the space or fix the folder and run again, TRAIN\.AUTO_RESUME continues from it\n"
        .format(re.escape(os.path.abspath(folder)), cause), err), err
    assert harness.checkpoint_names(tmp_path) == ["tiny-0000-b0000012.model", "tiny-0000-b0000016.model"]
    assert not any(f.endswith(".tmp") for f in os.listdir(folder))
    last_good = harness.training_state(os.path.join(folder, "tiny-0000-b0000016.model"))
    assert last_good["train_state"]["epoch_batch"] == 16

    assert harness.run_here(tiny_cfg, tmp_path) == 0  # the fault is gone
    assert "Resumed from {}: epoch 0, batch 16".format(os.path.join(folder, "tiny-0000-b0000016.model")) \
        in capsys.readouterr().out
    harness.assert_same(harness.training_state(os.path.join(folder, harness.FINAL)), clean_state)


def test_run_files_follow_the_umask(tiny_cfg, tmp_path):
    old = os.umask(0o027)
    try:
        assert harness.run_here(tiny_cfg, tmp_path, opts=["TRAIN.END_EPOCH", 1]) == 0
    finally:
        os.umask(old)
    folder = harness.out_dir(tmp_path)
    written = harness.checkpoint_names(tmp_path) + ["config.yaml"]
    assert {name: oct(os.stat(os.path.join(folder, name)).st_mode & 0o777) for name in written} == \
        {name: oct(0o640) for name in written}
