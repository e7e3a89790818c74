"""Config loading: paper YAMLs, reference effective values, legacy quirks, errors, round trip."""
import glob
import importlib
import json
import os

import pytest

from common.config import ConfigError, dump_config, to_plain
from tests.conftest import LEGACY, ROOT, load_task

REFERENCE = json.load(open(os.path.join(ROOT, "tests", "data", "reference_configs.json")))
LEGACY_CFGS = os.path.join(LEGACY, "cfgs")


def yaml_files(root):
    return sorted(glob.glob(os.path.join(root, "*", "*.yaml")))


def assert_contains(expected, got, prefix=""):
    """Every key of ``expected`` exists in ``got`` with an equal value (tuples compare as lists)."""
    for key, value in expected.items():
        assert key in got, "{}{} missing".format(prefix, key)
        if isinstance(value, dict):
            assert_contains(value, got[key], prefix + key + ".")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            assert len(value) == len(got[key])
            for i, (e, g) in enumerate(zip(value, got[key])):
                assert_contains(e, g, "{}{}[{}].".format(prefix, key, i))
        else:
            assert got[key] == value, "{}{}: {!r} != {!r}".format(prefix, key, got[key], value)


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------------------------------------ #
# Paper configs
# ------------------------------------------------------------------------------------------------ #
@pytest.mark.parametrize("path", yaml_files(os.path.join(ROOT, "cfgs")) + yaml_files(LEGACY_CFGS),
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_every_yaml_loads(path):
    task = os.path.basename(os.path.dirname(path))
    cfg = load_task(task).load_config(path)
    assert cfg.is_frozen()


@pytest.mark.parametrize("name", sorted(k for k in REFERENCE if k.startswith("cfgs/")))
def test_effective_values_equal_reference_loader(name):
    """Values equal those of the reference loader, for the legacy files and our copies."""
    task = name.split("/")[1]
    for root in (LEGACY_CFGS, os.path.join(ROOT, "cfgs")):
        cfg = load_task(task).load_config(os.path.join(root, name.split("/", 1)[1]))
        assert_contains(REFERENCE[name], to_plain(cfg))


def test_vcr_values_equal_reference_json():
    expected = json.load(open(os.path.join(LEGACY, "vcr_effective_configs.json")))
    api = load_task("vcr")
    for name, values in expected.items():
        path = None if name.startswith("defaults/") else os.path.join(LEGACY_CFGS, name.split("/", 1)[1])
        assert_contains(values, to_plain(api.load_config(path)))


@pytest.mark.parametrize("task", ["vcr", "vqa", "pretrain", "refcoco"])
def test_defaults_equal_reference(task):
    assert_contains(REFERENCE["defaults/" + task], to_plain(load_task(task).load_config()))


def test_fp16_config_is_fp32_with_dynamic_loss_scale():
    api = load_task("vcr")
    fp32 = to_plain(api.load_config(os.path.join(ROOT, "cfgs/vcr/base_q2a_4x16G_fp32.yaml")))
    fp16 = to_plain(api.load_config(os.path.join(ROOT, "cfgs/vcr/base_q2a_4x16G_fp16.yaml")))
    assert fp16["TRAIN"]["FP16"] is True and fp16["TRAIN"]["FP16_LOSS_SCALE"] == "dynamic"
    fp16["TRAIN"].update(FP16=False, FP16_LOSS_SCALE=128.0)
    assert fp16 == fp32


# ------------------------------------------------------------------------------------------------ #
# Legacy quirks
# ------------------------------------------------------------------------------------------------ #
def test_quirks_become_typed_values(tmp_path):
    path = write(tmp_path, """
SCALES: [600, 1200]
TRAIN:
  LR_STEP: "14,18"
  LOSS_LOGGERS: ["ans_loss,AnsLoss", "cnn_regularization_loss,CNNRegLoss"]
  FP16_LOSS_SCALE: 'dynamic'
  LR: 1e-4
  WD: 0
  CLIP_GRAD_NORM: 10
  BATCH_IMAGES: 4
  LR_MULT: [["vlbert", 2]]
NETWORK:
  PIXEL_MEANS: [102.9801, 115.9465, 122]
""")
    cfg = load_task("vcr").load_config(path)
    assert cfg.SCALES == (600, 1200)
    assert cfg.TRAIN.LR_STEP == (14.0, 18.0)
    assert cfg.TRAIN.LOSS_LOGGERS == [("ans_loss", "AnsLoss"), ("cnn_regularization_loss", "CNNRegLoss")]
    assert cfg.TRAIN.FP16_LOSS_SCALE == "dynamic"
    assert cfg.TRAIN.LR == 1e-4 and isinstance(cfg.TRAIN.LR, float)  # PyYAML reads 1e-4 as a string
    assert cfg.TRAIN.WD == 0.0 and isinstance(cfg.TRAIN.WD, float)  # int where a float is expected
    assert cfg.TRAIN.CLIP_GRAD_NORM == 10.0 and isinstance(cfg.TRAIN.CLIP_GRAD_NORM, float)
    assert cfg.TRAIN.LR_MULT == [("vlbert", 2.0)]
    assert cfg.NETWORK.PIXEL_MEANS == (102.9801, 115.9465, 122.0)


def test_numeric_loss_scale_and_lr_step_forms(tmp_path):
    api = load_task("vcr")
    cfg = api.load_config(write(tmp_path, "TRAIN:\n  FP16_LOSS_SCALE: 128\n  LR_STEP: 5\n"))
    assert cfg.TRAIN.FP16_LOSS_SCALE == 128.0 and cfg.TRAIN.LR_STEP == (5.0,)
    cfg = api.load_config(None, ["TRAIN.LR_STEP", "[3, 7]"])
    assert cfg.TRAIN.LR_STEP == (3.0, 7.0)


def test_dataset_list_entries_completed_from_defaults():
    cfg = load_task("pretrain").load_config(os.path.join(LEGACY_CFGS, "pretrain", "base_e2e_16x16G_fp16.yaml"))
    assert isinstance(cfg.DATASET, list) and len(cfg.DATASET) == 2
    assert cfg.DATASET[0].DATASET == "conceptual_captions" and cfg.DATASET[1].DATASET == "general_corpus"
    assert cfg.DATASET[1].SEQ_LEN == 64 and cfg.DATASET[1].MIN_SEQ_LEN == 64
    # keys absent from an entry take the task default
    assert cfg.DATASET[1].MASK_SIZE == 14 and cfg.DATASET[1].ZIP_MODE is False
    assert cfg.DATASET[0].SEQ_LEN == 64 and cfg.DATASET[0].MIN_SEQ_LEN == 0
    assert cfg.TRAIN.BATCH_IMAGES == [8, 8]
    assert cfg.DATASET[0].is_frozen() and cfg.DATASET[1].is_frozen()


def test_dataset_list_from_opts_replaces_the_file_list_and_starts_from_task_defaults():
    path = os.path.join(LEGACY_CFGS, "pretrain", "base_e2e_16x16G_fp16.yaml")
    api = load_task("pretrain")
    defaults = api.load_config().DATASET
    from_file = api.load_config(path).DATASET
    changed = sorted(k for k in defaults if from_file[0][k] != defaults[k] and k != "DATASET")
    assert "DATASET_PATH" in changed and "TRAIN_IMAGE_SET" in changed  # set by the file's first entry
    cfg = api.load_config(path, ["DATASET", "[{DATASET: general_corpus, MIN_SEQ_LEN: 32}]"])
    assert len(cfg.DATASET) == 1 and cfg.DATASET[0].DATASET == "general_corpus"
    assert cfg.DATASET[0].MIN_SEQ_LEN == 32 and cfg.DATASET[0].is_frozen()
    for key in changed:  # completed from the task defaults, not from the entry it replaces
        assert cfg.DATASET[0][key] == defaults[key], key


def test_update_config_merges_in_place(tmp_path):
    api = importlib.import_module("vqa.function.config")  # the reference's module API
    before = api.config.TRAIN.END_EPOCH
    try:
        api.update_config(write(tmp_path, "TRAIN:\n  END_EPOCH: 7\n"))
        assert api.config.TRAIN.END_EPOCH == 7
        assert not api.config.is_frozen()
    finally:
        api.config.TRAIN.END_EPOCH = before


# ------------------------------------------------------------------------------------------------ #
# Errors
# ------------------------------------------------------------------------------------------------ #
def test_unknown_key_names_file_line_key_and_closest(tmp_path):
    path = write(tmp_path, "TRAIN:\n  LR: 0.1\n  GRAD_ACCULATE_STEPS: 4\n")
    with pytest.raises(ConfigError) as e:
        load_task("vcr").load_config(path)
    assert str(e.value) == ("{}:3: TRAIN.GRAD_ACCULATE_STEPS: no such key; "
                            "did you mean TRAIN.GRAD_ACCUMULATE_STEPS?".format(path))


def test_unknown_nested_and_dataset_list_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"NETWORK\.VLBERT\.hiden_size: no such key; did you mean "
                                          r"NETWORK\.VLBERT\.hidden_size\?"):
        load_task("vcr").load_config(write(tmp_path, "NETWORK:\n  VLBERT:\n    hiden_size: 8\n"))
    with pytest.raises(ConfigError, match=r":3: DATASET\[1\]\.SEQ_LENN: no such key; did you mean "
                                          r"DATASET\[1\]\.SEQ_LEN\?"):
        load_task("pretrain").load_config(write(tmp_path, "DATASET:\n- DATASET: a\n- SEQ_LENN: 3\n"))


def test_wrong_type_names_key_expected_type_and_value(tmp_path):
    path = write(tmp_path, "TRAIN:\n  END_EPOCH: ten\n")
    with pytest.raises(ConfigError) as e:
        load_task("vcr").load_config(path)
    assert str(e.value) == "{}:2: TRAIN.END_EPOCH: expected int, got str 'ten'".format(path)
    with pytest.raises(ConfigError, match=r"TRAIN\.FP16: expected bool, got str 'yes please'"):
        load_task("vcr").load_config(write(tmp_path, "TRAIN:\n  FP16: yes please\n"))
    with pytest.raises(ConfigError, match=r"TRAIN\.LR: expected a number, got 'fast'"):
        load_task("vcr").load_config(write(tmp_path, "TRAIN:\n  LR: fast\n"))
    with pytest.raises(ConfigError, match=r"TRAIN\.FP16_LOSS_SCALE: expected a positive number or 'dynamic'"):
        load_task("vcr").load_config(write(tmp_path, "TRAIN:\n  FP16_LOSS_SCALE: auto\n"))
    with pytest.raises(ConfigError, match=r"TRAIN: expected a mapping of keys, got 3"):
        load_task("vcr").load_config(write(tmp_path, "TRAIN: 3\n"))


def test_missing_file_and_invalid_yaml(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read config file: No such file"):
        load_task("vcr").load_config(missing)
    path = write(tmp_path, "TRAIN:\n  LR: 0.1\n    WD: [\n")
    with pytest.raises(ConfigError) as e:
        load_task("vcr").load_config(path)
    assert str(e.value).startswith("{}:3:".format(path)) and "invalid YAML" in str(e.value)
    with pytest.raises(ConfigError, match="expected a mapping of config keys at the top level, got list"):
        load_task("vcr").load_config(write(tmp_path, "- 1\n- 2\n"))


def test_opts_overrides_are_checked():
    api = load_task("vcr")
    cfg = api.load_config(None, ["TRAIN.LR", "2e-5", "DATASET.DATASET_PATH", "", "TRAIN.FP16", "true"])
    assert cfg.TRAIN.LR == 2e-5 and cfg.DATASET.DATASET_PATH == "" and cfg.TRAIN.FP16 is True
    with pytest.raises(ConfigError, match=r"^--opts: TRAIN\.GRAD_ACCULATE_STEPS: no such key; did you mean "
                                          r"TRAIN\.GRAD_ACCUMULATE_STEPS\?$"):
        api.load_config(None, ["TRAIN.GRAD_ACCULATE_STEPS", "2"])
    with pytest.raises(ConfigError, match=r"^--opts: TRAIN\.END_EPOCH: expected int, got float 1\.5$"):
        api.load_config(None, ["TRAIN.END_EPOCH", "1.5"])
    with pytest.raises(ConfigError, match="odd number"):
        api.load_config(None, ["TRAIN.LR"])


# ------------------------------------------------------------------------------------------------ #
# Round trip
# ------------------------------------------------------------------------------------------------ #
@pytest.mark.parametrize("task,name", [("vcr", "vcr/large_q2a_4x16G_fp16.yaml"),
                                       ("pretrain", "pretrain/base_e2e_16x16G_fp16.yaml"),
                                       ("vqa", "vqa/base_4x16G_fp32.yaml")])
def test_written_config_loads_to_the_same_config(tmp_path, task, name):
    api = load_task(task)
    cfg = api.load_config(os.path.join(ROOT, "cfgs", name), ["TRAIN.LR", "1e-4"])
    out = str(tmp_path / "out" / "config.yaml")
    dump_config(cfg, out)
    again = api.load_config(out)
    assert again == cfg
    assert to_plain(again) == to_plain(cfg)
