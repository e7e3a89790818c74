"""bench/run_log.py: the figures bench/demo_time_to_accuracy.py reads back from a run's log."""
import os
import runpy

import pytest

from bench import run_log
from tests.conftest import ROOT
from tests.tiny_vcr import checkpoint, log_text

LOG = """2026-12-01 10:00:00,000 training on 2 process(es), device cpu; output folder out
2026-12-01 10:00:05,500 PROGRESS: 0.00%
2026-12-01 10:01:00,000 Epoch[0] Batch [10]\tSpeed: 4.1 samples/sec
2026-12-01 10:03:05,750 Epoch[0] \tVal-Acc=0.750000,\tLoss=0.610000,\t
2026-12-01 10:03:05,800 Epoch[0] \tVal-EMA-Acc=0.990000,\tEMA-Loss=0.100000,\t
not a log line Epoch[9] \tVal-Acc=1.000000,\t
2026-12-01 10:05:06,000 Epoch[1] \tVal-Acc=0.812500,\tLoss=0.402000,\t
2026-12-01 10:05:07,000 Training summary: 754 optimizer steps applied, 0 skipped (inf/nan gradients); final loss scale 1; 0.5200 s per optimizer step (754 steps in 392.1 s of training in this run)
"""


def test_validations_time_to_target_and_step_time_of_a_log():
    vals = run_log.validations(LOG)
    assert vals == [run_log.Validation(0, {"Acc": 0.75, "Loss": 0.61}, 180.25),
                    run_log.Validation(1, {"Acc": 0.8125, "Loss": 0.402}, 300.5)]
    assert run_log.time_to(LOG, "Acc", 0.8) == 300.5
    assert run_log.time_to(LOG, "Acc", 0.7) == 180.25
    assert run_log.time_to(LOG, "Acc", 0.9) is None and run_log.time_to(LOG, "Top5Acc", 0.1) is None
    assert run_log.seconds_per_step(LOG) == 0.52
    no_start = "\n".join(line for line in LOG.splitlines() if "PROGRESS" not in line)
    assert [v.seconds for v in run_log.validations(no_start)] == [None, None]
    assert run_log.seconds_per_step("") is None


def test_reads_the_log_of_a_real_run(tiny_init):
    """The tiny VCR run's own log (vcr/train_end2end.py's engine): its validation equals the checkpoint's."""
    model_dir, _ = tiny_init
    text = log_text(model_dir)
    vals = run_log.validations(text)
    assert [v.epoch for v in vals] == [0]
    assert vals[0].metrics["Acc"] == pytest.approx(checkpoint(model_dir, 0)["validation_monitor"]["best_val"], abs=1e-6)
    assert vals[0].seconds > 0
    assert run_log.seconds_per_step(text) > 0


def test_demo_bench_line_of_a_real_log(tiny_init):
    """bench/demo_time_to_accuracy.py's figure line, from the tiny run's log."""
    text = log_text(tiny_init[0])
    line = runpy.run_path(os.path.join(ROOT, "bench", "demo_time_to_accuracy.py"))["log_figures"](text)
    acc, per_step = run_log.validations(text)[0], run_log.seconds_per_step(text)
    reached = run_log.time_to(text, "Acc", 0.8)
    assert line == "Val-Acc epoch 0 {:.3f} at {:.0f} s; Val-Acc >= 0.8 {} after the first step; {:.3f} s per optimizer " \
                   "step".format(acc.metrics["Acc"], acc.seconds, "never" if reached is None else "{:.0f} s".format(reached),
                                 per_step)
    assert runpy.run_path(os.path.join(ROOT, "bench", "demo_time_to_accuracy.py"))["log_figures"]("") == \
        "Val-Acc none logged; Val-Acc >= 0.8 never after the first step; ? s per optimizer step"
