"""Every config key is acted on, warned about or refused: the KEY_STATUS table of each task (see
common/config/keys.py), checked by ``check_config`` at the entry points."""
import contextlib
import glob
import importlib
import logging
import os
import subprocess
import sys

import pytest

from common.config import ConfigError
from common.config.keys import IMPLEMENTED, REFUSED, WARNED, leaf_keys
from tests.conftest import ROOT, load_task
from vcr.function.test import val_correct
from vcr.task import TASK as VCR_TASK

TASKS = ("vcr", "vqa", "pretrain", "refcoco")


def api(task):
    return importlib.import_module("{}.function.config".format(task))


def defaults(task):
    return load_task(task).load_config()


# ------------------------------------------------------------------------------------------------ #
# The table: what each key does, per task
# ------------------------------------------------------------------------------------------------ #
COMMON_WARNED = ["GPUS", "DATASET.ROOT_PATH", "DATASET.IGNORE_DB_CACHE", "NETWORK.BERT_ALIGN_QUESTION",
                 "NETWORK.BERT_ALIGN_ANSWER", "NETWORK.BERT_USE_LAYER", "NETWORK.BERT_WITH_NSP_LOSS",
                 "NETWORK.BERT_WITH_MLM_LOSS", "NETWORK.VLBERT.input_size", "NETWORK.VLBERT.input_transform_type",
                 "VAL.SHUFFLE", "TEST.SHUFFLE", "TEST.TEST_EPOCH"]
NOT_IMPLEMENTED = {
    "vcr": dict(
        dict.fromkeys(COMMON_WARNED, WARNED),
        **dict.fromkeys(["DATASET.APPEND_INDEX", "DATASET.CACHE_MODE", "DATASET.QA2R_AUG",
                         "NETWORK.FOR_MASK_VL_MODELING_PRETRAIN", "NETWORK.IMAGE_FEAT_PRECOMPUTED",
                         "NETWORK.OUTPUT_CONV5"], REFUSED)),
    "vqa": dict(
        dict.fromkeys(COMMON_WARNED + ["NETWORK.CNN_LOSS_WEIGHT",
                                       "NETWORK.ANS_LOSS_WEIGHT", "NETWORK.REPLACE_OBJECT_CHANGE_LABEL",
                                       "DATASET.TASK", "DATASET.BASIC_ALIGN", "DATASET.TRAIN_ANNOTATION_FILE",
                                       "DATASET.VAL_ANNOTATION_FILE", "DATASET.TEST_ANNOTATION_FILE",
                                       "DATASET.ONLY_USE_RELEVANT_DETS", "DATASET.MASK_SIZE", "DATASET.QA2R_NOQ",
                                       "DATASET.QA2R_AUG"], WARNED),
        **dict.fromkeys(["DATASET.APPEND_INDEX", "DATASET.CACHE_MODE", "NETWORK.FOR_MASK_VL_MODELING_PRETRAIN",
                         "NETWORK.OUTPUT_CONV5", "NETWORK.CLASSIFIER_SIGMOID",
                         "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT"], REFUSED)),
    "pretrain": dict(
        dict.fromkeys(COMMON_WARNED + ["NETWORK.FOR_MASK_VL_MODELING_PRETRAIN", "NETWORK.ENABLE_CNN_REG_LOSS",
                                       "NETWORK.CNN_LOSS_WEIGHT", "NETWORK.ANS_LOSS_WEIGHT", "NETWORK.CLASSIFIER_TYPE",
                                       "NETWORK.CLASSIFIER_HIDDEN_SIZE", "NETWORK.CLASSIFIER_DROPOUT",
                                       "NETWORK.CLASSIFIER_SIGMOID",
                                       "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT",
                                       "DATASET.LABEL_INDEX_IN_BATCH", "DATASET.TASK", "DATASET.BASIC_ALIGN",
                                       "DATASET.ONLY_USE_RELEVANT_DETS", "DATASET.MASK_SIZE", "DATASET.QA2R_NOQ",
                                       "DATASET.QA2R_AUG", "DATASET.ANSWER_VOCAB_FILE", "DATASET.ANSWER_VOCAB_SIZE"],
                      WARNED),
        **dict.fromkeys(["DATASET.CACHE_MODE", "NETWORK.BLIND", "NETWORK.NO_GROUNDING", "NETWORK.NO_OBJ_ATTENTION",
                         "NETWORK.OUTPUT_CONV5", "NETWORK.VLBERT.object_word_embed_mode", "TRAIN.LABEL_SMOOTHING"],
                        REFUSED)),
    "refcoco": dict(
        dict.fromkeys(COMMON_WARNED + ["DATASET.TASK", "DATASET.BASIC_ALIGN", "DATASET.TRAIN_ANNOTATION_FILE",
                                       "DATASET.VAL_ANNOTATION_FILE", "DATASET.TEST_ANNOTATION_FILE",
                                       "DATASET.ONLY_USE_RELEVANT_DETS", "DATASET.MASK_SIZE", "DATASET.QA2R_NOQ",
                                       "DATASET.QA2R_AUG", "DATASET.ANSWER_VOCAB_FILE", "DATASET.ANSWER_VOCAB_SIZE",
                                       "DATASET.USE_IMDB", "NETWORK.NO_GROUNDING", "NETWORK.NO_OBJ_ATTENTION",
                                       "NETWORK.ENABLE_CNN_REG_LOSS", "NETWORK.CNN_LOSS_WEIGHT",
                                       "NETWORK.ANS_LOSS_WEIGHT", "NETWORK.CLASSIFIER_TYPE",
                                       "NETWORK.CLASSIFIER_HIDDEN_SIZE", "NETWORK.CLASSIFIER_SIGMOID",
                                       "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT",
                                       "NETWORK.CLASSIFIER_PRETRAINED", "NETWORK.ANS_LOSS_TYPE",
                                       "NETWORK.REPLACE_OBJECT_CHANGE_LABEL"], WARNED),
        **dict.fromkeys(["DATASET.APPEND_INDEX", "DATASET.CACHE_MODE", "NETWORK.IMAGE_FEAT_PRECOMPUTED",
                         "NETWORK.OUTPUT_CONV5", "NETWORK.VLBERT.object_word_embed_mode",
                         "NETWORK.VLBERT.with_pooler", "TRAIN.LABEL_SMOOTHING"], REFUSED)),
}


@pytest.mark.parametrize("task", TASKS)
def test_every_key_of_every_task_has_its_status(task):
    """The table covers every key of the task's defaults (a new key without a status fails here),
    with the status listed above; every other key is acted on."""
    keys = [key for key, _ in leaf_keys(defaults(task))]
    table = api(task).KEY_STATUS
    assert sorted(table) == sorted(keys)
    assert set(NOT_IMPLEMENTED[task]) <= set(keys)
    expected = {key: NOT_IMPLEMENTED[task].get(key, IMPLEMENTED) for key in keys}
    assert {key: status.kind for key, status in table.items()} == expected
    assert all(status.reason for status in table.values() if status.kind != IMPLEMENTED)


def test_a_misspelt_key_in_a_status_table_is_an_error():
    from common.config.keys import DONE, task_key_status
    with pytest.raises(ValueError, match="NETWORK.BLND"):
        task_key_status(defaults("vcr"), {"NETWORK.BLND": DONE})


def other_value(value):
    """A value of the same type as ``value`` that differs from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_other"
    return list(value) + [value[0] if value else "x"]


def with_value(cfg, key, value):
    cfg = cfg.clone()
    cfg.defrost()
    node = cfg
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    node[last] = value
    return cfg


@contextlib.contextmanager
def config_warnings():
    """The lines ``check_config`` logs (logger ``vlbert.config``) inside the block, as a list of strings."""
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger("vlbert.config")
    log.addHandler(handler)
    try:
        yield lines
    finally:
        log.removeHandler(handler)


def not_implemented(task, kind):
    return [(task, key) for key, status in api(task).KEY_STATUS.items() if status.kind == kind]


@pytest.mark.parametrize("task,key", [tk for task in TASKS for tk in not_implemented(task, WARNED)])
def test_warned_key_warns_naming_the_key(task, key):
    default = dict(leaf_keys(defaults(task)))[key]
    cfg = with_value(defaults(task), key, other_value(default))
    with config_warnings() as lines:
        load_task(task).check_config(cfg, "my.yaml")
    assert len(lines) == 1
    assert lines[0].startswith("warning: my.yaml: {} = {!r}: ".format(key, other_value(default)))
    assert lines[0].endswith("; the value is ignored")


@pytest.mark.parametrize("task,key", [tk for task in TASKS for tk in not_implemented(task, REFUSED)])
def test_refused_key_stops_naming_the_key(task, key):
    default = dict(leaf_keys(defaults(task)))[key]
    cfg = with_value(defaults(task), key, other_value(default))
    with pytest.raises(ConfigError, match=r"^my\.yaml: {} = .*\(default .*\)$".format(key.replace(".", r"\."))):
        load_task(task).check_config(cfg, "my.yaml")


@pytest.mark.parametrize("task", TASKS)
def test_defaults_and_implemented_keys_pass_silently(task):
    with config_warnings() as lines:
        load_task(task).check_config(defaults(task))
        cfg = defaults(task)
        for key, status in api(task).KEY_STATUS.items():
            if status.kind == IMPLEMENTED and status.refuse_if is None:  # refused_if: tests/test_label_smoothing.py
                cfg = with_value(cfg, key, other_value(dict(leaf_keys(cfg))[key]))
        load_task(task).check_config(cfg)
    assert lines == []


@pytest.mark.parametrize("task,demo", [("vcr", "demo_q2a_"), ("refcoco", "demo_cpu.yaml")])
def test_shipped_configs_warn_only_about_gpus_and_the_cache_root(task, demo):
    paths = sorted(glob.glob(os.path.join(ROOT, "cfgs", task, "*.yaml")))
    assert len(paths) >= 5
    for path in paths:
        with config_warnings() as lines:
            load_task(task).check_config(load_task(task).load_config(path), path)
        keys = sorted(line.split(": ")[2].split(" = ")[0] for line in lines)
        # the demo configs (names starting with ``demo``: the ResNet and ViT VCR demos) set neither
        assert keys == ([] if os.path.basename(path).startswith(demo) else ["DATASET.ROOT_PATH", "GPUS"]), path


def test_entry_points_refuse_and_warn_before_anything_runs(tmp_path):
    """Training: a refused value is one `error:` line (exit code 2) naming the key, before any data is read
    or any output written; a warned key is named on the way. Evaluation refuses before reading the checkpoint."""
    cfg = "cfgs/vcr/demo_q2a_cpu.yaml"
    out = subprocess.run([sys.executable, "vcr/train_end2end.py", "--cfg", cfg, "--model-dir", str(tmp_path), "--opts",
                          "TEST.TEST_EPOCH", "3", "DATASET.CACHE_MODE", "true", "DATASET.DATASET_PATH", "/no/data"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "warning: {}: TEST.TEST_EPOCH = 3: the test scripts take the checkpoint file".format(cfg) \
        in out.stdout + out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: {}: DATASET.CACHE_MODE = True: not implemented (the reference's VCR data set refuses it too) "
        "(default False)".format(cfg))
    assert not os.listdir(str(tmp_path))

    refused = load_task("vcr").load_config(os.path.join(ROOT, cfg), ["DATASET.QA2R_AUG", "true"])
    with pytest.raises(ConfigError, match=r"^config: DATASET\.QA2R_AUG = True: not implemented"):
        val_correct(VCR_TASK, refused, str(tmp_path / "no.model"))


def test_shipped_pretrain_configs_warn_only_about_keys_the_reference_never_read():
    """The training configs load and pass the check; their warned keys are ones the reference ignored too."""
    for path in sorted(glob.glob(os.path.join(ROOT, "cfgs", "pretrain", "*.yaml"))):
        if os.path.basename(path).startswith("vis_attention_maps_"):  # the attention-map script's configs
            continue
        with config_warnings() as lines:
            load_task("pretrain").check_config(load_task("pretrain").load_config(path), path)
        keys = sorted({line.split(": ")[2].split(" = ")[0] for line in lines})
        expected = [] if path.endswith("demo_e2e_cpu.yaml") else [
            "DATASET.IGNORE_DB_CACHE", "DATASET.ROOT_PATH", "GPUS", "NETWORK.ENABLE_CNN_REG_LOSS"]
        assert keys == expected, path


def test_vqa_demo_config_trains_without_a_warning(tmp_path, monkeypatch, capsys):
    """vqa/train_end2end.py on cfgs/vqa/demo_cpu.yaml: no warning before the data check (its
    NETWORK.ENABLE_CNN_REG_LOSS false is acted on: the VQA model then has no regularizing predictor)."""
    from common.cli import run_main
    from common.engine import train_main
    from vqa.task import TASK as VQA_TASK
    monkeypatch.setattr(sys, "argv", ["vqa/train_end2end.py", "--cfg", os.path.join(ROOT, "cfgs", "vqa", "demo_cpu.yaml"),
                                      "--model-dir", str(tmp_path), "--opts", "DATASET.DATASET_PATH", "/no/data"])
    with pytest.raises(SystemExit) as e:
        run_main(lambda: train_main(VQA_TASK, "t"))
    out = capsys.readouterr()
    assert e.value.code == 2 and "DATASET.DATASET_PATH: data folder '/no/data'" in out.err
    assert "warning" not in out.out + out.err
