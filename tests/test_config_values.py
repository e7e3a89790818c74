"""Value ranges checked when the config is read: the training entry points stop with one ``error:``
line per bad value, naming the file (or --opts), the key and the expected range, exit code 2, before
anything is built (the paper configs name data and models this machine lacks: reaching them would
give another message)."""
import os

import pytest

from common.config import common_defaults
from common.config.keys import leaf_keys
from common.config.values import SHARED_RULES
from tests.tiny_vcr import CFG, ROOT, run_script

VCR = os.path.join(ROOT, "vcr", "train_end2end.py")
VQA = os.path.join(ROOT, "vqa", "train_end2end.py")
PRETRAIN = os.path.join(ROOT, "pretrain", "train_end2end.py")
VQA_CFG = os.path.join(ROOT, "cfgs", "vqa", "base_4x16G_fp32.yaml")
PRETRAIN_CFG = os.path.join(ROOT, "cfgs", "pretrain", "base_e2e_16x16G_fp16.yaml")

# (entry, config, --opts key, value, the error after "--opts: KEY: expected ")
CASES = [
    (VCR, CFG, "TRAIN.GRAD_ACCUMULATE_STEPS", "0", "an int >= 1, got 0"),
    (VCR, CFG, "TRAIN.LR", "-1e-4", "a number >= 0, got -0.0001"),
    (VCR, CFG, "TRAIN.BATCH_IMAGES", "0", "an int >= 1, got 0"),
    (VCR, CFG, "TRAIN.BATCH_IMAGES", "[2, 0]", "an int >= 1, got [2, 0]"),
    (VCR, CFG, "VAL.BATCH_IMAGES", "-1", "an int >= 1, got -1"),
    (VCR, CFG, "TRAIN.WARMUP_STEPS", "-1", "an int >= 0, got -1"),
    (VCR, CFG, "TRAIN.WARMUP_FACTOR", "1.5", "a number in [0, 1], got 1.5"),
    (VCR, CFG, "TRAIN.FP16_LOSS_SCALE", "0", "'dynamic' or a number > 0, got 0.0"),
    (VCR, CFG, "TRAIN.FLIP_PROB", "1.5", "a number in [0, 1], got 1.5"),
    (VCR, CFG, "TRAIN.MOMENTUM", "-0.9", "a number in [0, 1], got -0.9"),
    (VCR, CFG, "TRAIN.WD", "-1", "a number >= 0, got -1.0"),
    (VCR, CFG, "TRAIN.END_EPOCH", "0", "an int > TRAIN.BEGIN_EPOCH (0), got 0"),
    (VCR, CFG, "TRAIN.MAX_CONSECUTIVE_SKIPS", "0", "an int >= 1, got 0"),
    (VCR, CFG, "TRAIN.CHECKPOINT_KEEP", "0", "an int >= 1, got 0"),
    (VCR, CFG, "TRAIN.LR_MIN", "1e-4", "a number in [0, TRAIN.LR (7e-05)], got 0.0001"),
    (VCR, CFG, "TRAIN.LABEL_SMOOTHING", "1.5", "a number in [0, 1], got 1.5"),
    (VCR, CFG, "TRAIN.OPTIM_STATE_DTYPE", "float16", "one of float32, bfloat16, got 'float16'"),
    (VCR, CFG, "NUM_WORKERS_PER_GPU", "-2", "an int >= 0, got -2"),
    (VCR, CFG, "NETWORK.IMAGE_NUM_LAYERS", "42", "one of 18, 34, 50, 101, 152, got 42"),
    (VCR, CFG, "NETWORK.VLBERT.hidden_dropout_prob", "-0.1", "a number in [0, 1], got -0.1"),
    (VCR, CFG, "NETWORK.VLBERT.num_attention_heads", "7",
     "an int >= 1 dividing NETWORK.VLBERT.hidden_size (768), got 7"),
    (VCR, CFG, "NETWORK.PIXEL_STDS", "[1, 0, 1]", "a number > 0, got (1.0, 0.0, 1.0)"),
    # keys that VCR alone declares (vcr/function/config.py)
    (VCR, CFG, "NETWORK.CNN_REG_DROPOUT", "2", "a number in [0, 1], got 2.0"),
    (VCR, CFG, "DATASET.MASK_SIZE", "0", "an int >= 1, got 0"),
    (VQA, VQA_CFG, "DATASET.ANSWER_VOCAB_SIZE", "0", "an int >= 1, got 0"),
    (PRETRAIN, PRETRAIN_CFG, "TRAIN.BATCH_IMAGES", "[4, 0]", "an int >= 1, got [4, 0]"),
]


def _run(capsys, entry, argv):
    code = run_script(entry, argv)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("entry,cfg,key,value,expected", CASES, ids=["{}={}".format(c[2], c[3]) for c in CASES])
def test_bad_opts_value_stops_with_one_error_line(tmp_path, capsys, entry, cfg, key, value, expected):
    code, lines = _run(capsys, entry, ["--cfg", cfg, "--model-dir", str(tmp_path), "--opts", key, value])
    assert (code, lines) == (2, ["error: --opts: {}: expected {}".format(key, expected)])
    assert os.listdir(tmp_path) == []


def test_bad_file_values_each_get_a_line_naming_file_and_line(tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text("DATASET:\n- DATASET: conceptual_captions\n  MAX_SKIPPED_SHARE: 2\n"
                    "TRAIN:\n  GRAD_ACCUMULATE_STEPS: 0\n  BEGIN_EPOCH: 3\n  END_EPOCH: 3\n")
    code, lines = _run(capsys, PRETRAIN, ["--cfg", str(path), "--model-dir", str(tmp_path / "out")])
    assert (code, lines) == (2, [
        "error: {}:3: DATASET[0].MAX_SKIPPED_SHARE: expected a number in [0, 1], got 2.0".format(path),
        "error: {}:7: TRAIN.END_EPOCH: expected an int > TRAIN.BEGIN_EPOCH (3), got 3".format(path),
        "error: {}:5: TRAIN.GRAD_ACCUMULATE_STEPS: expected an int >= 1, got 0".format(path)])
    # a bad file value that --opts replaces is not an error, nor a default (END_EPOCH 0) nobody set
    from pretrain.task import TASK as PRETRAIN_TASK
    cfg = PRETRAIN_TASK.load_config(str(path), ["DATASET", "[{MAX_SKIPPED_SHARE: 0.5}]", "TRAIN.GRAD_ACCUMULATE_STEPS", "2",
                                  "TRAIN.END_EPOCH", "4", "TRAIN.LR", "0"])
    assert (cfg.DATASET[0].MAX_SKIPPED_SHARE, cfg.TRAIN.GRAD_ACCUMULATE_STEPS, cfg.TRAIN.LR) == (0.5, 2, 0.0)
    assert PRETRAIN_TASK.load_config().TRAIN.END_EPOCH == 0


@pytest.mark.parametrize("task", ["vcr", "vqa", "refcoco", "pretrain"])
def test_rules_name_existing_keys(task):
    """A misspelt key in a rule table would never be checked."""
    import importlib
    module = importlib.import_module("{}.function.config".format(task))
    keys = {key for key, _ in leaf_keys(getattr(module, "{}_defaults".format(task))())}
    shared = {key for key, _ in leaf_keys(common_defaults())}
    assert set(SHARED_RULES) <= shared
    assert set(module.VALUE_RULES) - set(SHARED_RULES) <= keys


def test_a_rule_reading_another_key_reads_it_in_the_same_dataset_list_entry(tmp_path, capsys):
    """DATASET.LMDB_MODE reads DATASET.ZIP_MODE: in a DATASET list, of its own entry (not a crash on the list)."""
    from pretrain.task import TASK as PRETRAIN_TASK
    path = tmp_path / "cfg.yaml"
    path.write_text("DATASET:\n- DATASET: conceptual_captions\n  LMDB_MODE: true\n"
                    "- DATASET: conceptual_captions\n  ZIP_MODE: true\n")
    cfg = PRETRAIN_TASK.load_config(str(path))
    assert [(d.LMDB_MODE, d.ZIP_MODE) for d in cfg.DATASET] == [(True, False), (False, True)]
    path.write_text("DATASET:\n- DATASET: conceptual_captions\n- DATASET: conceptual_captions\n"
                    "  ZIP_MODE: true\n  LMDB_MODE: true\n")
    code, lines = _run(capsys, PRETRAIN, ["--cfg", str(path), "--model-dir", str(tmp_path / "out")])
    assert (code, lines) == (2, ["error: {}:5: DATASET[1].LMDB_MODE: expected false when DATASET.ZIP_MODE is true "
                                 "(one storage at a time), got True".format(path)])
