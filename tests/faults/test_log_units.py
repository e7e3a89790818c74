"""LOG_FREQUENT counts micro-batches in the log line and in TensorBoard, and both report one samples/s
(the tiny task through its entry point, in this process)."""
import re

from common.diagnostics.tb_events import read_scalars
from tests.faults import harness
from tests.tiny_vcr import log_text_in


def test_log_line_and_tensorboard_share_the_unit_and_the_speed(tiny_cfg, tmp_path):
    # 16 micro-batches of 4 per epoch, k = 2; log points at micro-batches 0, 6 and 12 of each epoch
    assert harness.run_here(tiny_cfg, tmp_path, opts=["LOG_FREQUENT", 6, "TRAIN.END_EPOCH", 2]) == 0
    folder = harness.out_dir(tmp_path)
    log = log_text_in(folder)
    lines = re.findall(r"Epoch\[(\d)\] Batch \[(\d+)\]\tSpeed: ([\d.-]+)", log)
    assert [(int(e), int(b)) for e, b, _ in lines] == [(e, b) for e in (0, 1) for b in (0, 6, 12)]
    scalars = read_scalars(folder + "/tensorboard_logs")
    # TensorBoard: at the end of the step of each log point (x = global micro-batch index)
    assert [x for x, _ in scalars["Train-Loss"]] == [e * 16 + b for e in (0, 1) for b in (1, 7, 13)]
    # ... with the log line's samples/s (none at an epoch's first micro-batch, whose line has none)
    logged = {int(e) * 16 + int(b) + 1: float(s) for e, b, s in lines if s != "-"}
    speeds = dict(scalars["Speed/samples_per_s"])
    assert sorted(speeds) == sorted(logged)
    for x, value in speeds.items():
        # the event file holds a float32, the line the float64 to 2 decimals: equal to within both roundings
        assert abs(value - logged[x]) <= 0.005 + abs(logged[x]) * 2 ** -23, x


def test_rerun_of_a_finished_run_says_it_trained_nothing(tiny_cfg, tmp_path):
    """Run again, a finished run resumes at its end (TRAIN.AUTO_RESUME): its summary says that no step was
    trained, instead of 'nan s per optimizer step (0 steps in 0.0 s ...)'."""
    opts = ["TRAIN.END_EPOCH", 1]
    assert harness.run_here(tiny_cfg, tmp_path, opts=opts) == 0
    assert harness.run_here(tiny_cfg, tmp_path, opts=opts) == 0
    summaries = re.findall(r"Training summary: (.*)", log_text_in(harness.out_dir(tmp_path)))
    assert len(summaries) == 2, summaries
    assert re.fullmatch(r"8 optimizer steps applied, 0 skipped \(inf/nan gradients\); final loss scale \d+; "
                        r"[0-9.]+ s per optimizer step \(8 steps in [0-9.]+ s of training in this run\)", summaries[0])
    assert re.fullmatch(r"8 optimizer steps applied, 0 skipped \(inf/nan gradients\); final loss scale \d+; "
                        r"no optimizer step in this run \(nothing was left to train\)", summaries[1]), summaries[1]
