"""tools/plot_curves.py and common.diagnostics.tb_events: the PNG of a run's TensorBoard scalars."""
import os
import subprocess
import sys

import pytest
from tensorboardX import SummaryWriter

from common.diagnostics.tb_events import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "plot_curves.py")


def _write_run(folder, steps, purge_step=None, start=0, suffix=".0"):
    # (the suffix orders two files of the same second, as their times do in real runs)
    writer = SummaryWriter(log_dir=folder, purge_step=purge_step, filename_suffix=suffix)
    for step in range(start, steps):
        writer.add_scalar("Train-Loss", 1.0 / (step + 1), step)
        writer.add_scalar("Train-Acc", step / 10.0, step)
        writer.add_scalar("LR/Group_0", 1e-4 * step, step)
        writer.add_scalar("Loss-Scale", 128.0, step)
        writer.add_scalar("Skipped-Steps", 0, step)
        writer.add_scalar("Speed/samples_per_s", 3.0, step)
        writer.add_scalar("Memory/peak_MiB", 500.0, step)
    writer.add_scalar("Val-Acc", 0.5, steps - 1)
    writer.close()


def test_read_scalars_applies_the_purge_of_a_resumed_run(tmp_path):
    folder = str(tmp_path / "tensorboard_logs")
    _write_run(folder, 6)           # a run that died after step 5, its checkpoint at step 3
    _write_run(folder, 8, purge_step=3, start=3, suffix=".1")
    scalars = read_scalars(folder)
    assert [s for s, _ in scalars["Train-Loss"]] == list(range(8))
    assert scalars["Train-Loss"][4] == (4, pytest.approx(0.2))
    assert [s for s, _ in scalars["Val-Acc"]] == [7]  # the dead run's Val-Acc at 5 is hidden


def test_plot_curves_writes_a_png_of_every_panel(tmp_path):
    run = tmp_path / "output" / "vcr1images_train"
    _write_run(str(run / "tensorboard_logs"), 5)
    done = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "curves.png"
    assert done.stdout.strip() == str(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10000

    from common.diagnostics.curves import panels  # the tool's panels

    got = {title: ([t for t, _ in left], [t for t, _ in right]) for title, left, right in panels(read_scalars(
        str(run / "tensorboard_logs")))}
    assert list(got.values()) == [(["Train-Loss"], []), (["Train-Acc", "Val-Acc"], []), (["LR/Group_0"], []),
                                  (["Loss-Scale"], ["Skipped-Steps"]), (["Speed/samples_per_s"], ["Memory/peak_MiB"])]


def test_plot_curves_names_a_folder_without_events(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "error: {}: no tensorboard_logs folder with event files in or " \
                                                   "below it".format(tmp_path)
