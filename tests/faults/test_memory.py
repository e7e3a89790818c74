"""Memory over time: 2,000 micro-batches of the tiny task through the real trainer, with a log line,
TensorBoard scalars and metric updates at every step, validation every epoch and checkpoints. Peak RSS
after warm-up grows by less than 2%: metrics and logging keep no tensors (nor their graphs)."""
from tests.faults import harness

EPOCHS = 125  # x 16 micro-batches = 2,000
WARM_UP = 400  # micro-batches: 25 epochs, so 25 validations, 5 epoch and 8 mid-epoch checkpoints


def test_peak_rss_flat_after_warm_up(tiny_cfg, tmp_path):
    rss_log = tmp_path / "rss.txt"
    rc, out, err = harness.run(tiny_cfg, tmp_path / "m", timeout=600, faults={"FAULT_RSS_LOG": rss_log},
                               opts=["TRAIN.END_EPOCH", EPOCHS, "TRAIN.CHECKPOINT_STEPS", 25, "CHECKPOINT_FREQUENT", 5])
    assert rc == 0, err[-3000:]
    assert out.count("Val-Acc=") == EPOCHS
    peak = dict(tuple(int(v) for v in line.split()) for line in rss_log.read_text().splitlines())
    assert max(peak) == 16 * EPOCHS
    growth = peak[16 * EPOCHS] / peak[WARM_UP] - 1
    assert growth < 0.02, "peak RSS grew {:.1%} from micro-batch {} to {}: {}".format(
        growth, WARM_UP, 16 * EPOCHS, peak)
    # Most of the RSS is torch's libraries, so 2% is ~14 MB. Also bound the growth by 4 MiB, 2.6 kB a
    # micro-batch: one kept loss graph (~10 kB a micro-batch here) already exceeds it.
    assert peak[16 * EPOCHS] - peak[WARM_UP] < 4 * 1024, peak
