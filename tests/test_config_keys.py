"""Every config key is acted on, warned about or refused (common/config_keys.py, KEY_STATUS of each task),
the lossless coercions of values users write, and the effect of the keys that the reference declared
without reading (BERT_FROZEN, ANS_LOSS_TYPE, the visual scales, VAL_FREQUENT)."""
import glob
import importlib
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from common import amp
from common.callbacks.validation_monitor import ValidationMonitor
from common.config import ConfigError
from common.config_keys import IMPLEMENTED, REFUSED, WARNED, ConfigKeyWarning, leaf_keys
from common.errors import UserInputError
from common.metrics.composite_eval_metric import CompositeEvalMetric
from common.metrics.eval_metric import EvalMetric
from common.optim import build_optimizer, images_per_step
from common.trainer import train
from tests.conftest import ROOT
from tests.test_modules import TINY, vcr_batch
from tests.test_trainer import Toy, _batches
from vcr.function.test import val_correct

TASKS = ("vcr", "vqa", "pretrain", "refcoco")

pytestmark = [pytest.mark.filterwarnings('ignore:NETWORK.*(BERT_MODEL_NAME|IMAGE_PRETRAINED) is empty')]


def api(task):
    return importlib.import_module("{}.function.config".format(task))


def defaults(task):
    return api(task).load_config()


# ------------------------------------------------------------------------------------------------ #
# The table: what each key does, per task
# ------------------------------------------------------------------------------------------------ #
COMMON_WARNED = ["GPUS", "DATASET.ROOT_PATH", "DATASET.IGNORE_DB_CACHE", "NETWORK.BERT_ALIGN_QUESTION",
                 "NETWORK.BERT_ALIGN_ANSWER", "NETWORK.BERT_USE_LAYER", "NETWORK.BERT_WITH_NSP_LOSS",
                 "NETWORK.BERT_WITH_MLM_LOSS", "NETWORK.VLBERT.input_size", "NETWORK.VLBERT.input_transform_type",
                 "VAL.SHUFFLE", "TEST.SHUFFLE", "TEST.TEST_EPOCH"]
# Keys only a data set reads: VQA and pretraining have no data loader yet.
DATA_KEYS = ["DATASET.APPEND_INDEX", "DATASET.TASK", "DATASET.BASIC_ALIGN", "DATASET.DATASET_PATH",
             "DATASET.TRAIN_IMAGE_SET", "DATASET.VAL_IMAGE_SET", "DATASET.TEST_IMAGE_SET",
             "DATASET.TRAIN_ANNOTATION_FILE", "DATASET.VAL_ANNOTATION_FILE", "DATASET.TEST_ANNOTATION_FILE",
             "DATASET.ONLY_USE_RELEVANT_DETS", "DATASET.ADD_IMAGE_AS_A_BOX", "DATASET.ZIP_MODE", "DATASET.CACHE_MODE",
             "DATASET.MASK_SIZE", "DATASET.QA2R_NOQ", "DATASET.QA2R_AUG", "DATASET.ANSWER_VOCAB_FILE",
             "TRAIN.LOSS_LOGGERS"]
NOT_IMPLEMENTED = {
    "vcr": dict(
        dict.fromkeys(COMMON_WARNED, WARNED),
        **dict.fromkeys(["DATASET.APPEND_INDEX", "DATASET.CACHE_MODE", "DATASET.QA2R_AUG",
                         "NETWORK.FOR_MASK_VL_MODELING_PRETRAIN", "NETWORK.IMAGE_FEAT_PRECOMPUTED",
                         "NETWORK.OUTPUT_CONV5"], REFUSED)),
    "vqa": dict(
        dict.fromkeys(COMMON_WARNED + ["NETWORK.ENABLE_CNN_REG_LOSS", "NETWORK.CNN_LOSS_WEIGHT",
                                       "NETWORK.ANS_LOSS_WEIGHT", "NETWORK.REPLACE_OBJECT_CHANGE_LABEL"], WARNED),
        **dict.fromkeys(DATA_KEYS + ["DATASET.USE_IMDB", "DATASET.BOXES", "NETWORK.IMAGE_FEAT_PRECOMPUTED",
                                     "NETWORK.BLIND", "NETWORK.FOR_MASK_VL_MODELING_PRETRAIN",
                                     "NETWORK.NO_OBJ_ATTENTION", "NETWORK.OUTPUT_CONV5", "NETWORK.CLASSIFIER_SIGMOID",
                                     "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT",
                                     "NETWORK.CLASSIFIER_PRETRAINED"], REFUSED)),
    "pretrain": dict(
        dict.fromkeys(COMMON_WARNED + ["NETWORK.FOR_MASK_VL_MODELING_PRETRAIN", "NETWORK.ENABLE_CNN_REG_LOSS",
                                       "NETWORK.CNN_LOSS_WEIGHT", "NETWORK.ANS_LOSS_WEIGHT", "NETWORK.CLASSIFIER_TYPE",
                                       "NETWORK.CLASSIFIER_HIDDEN_SIZE", "NETWORK.CLASSIFIER_DROPOUT",
                                       "NETWORK.CLASSIFIER_SIGMOID",
                                       "NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT"], WARNED),
        **dict.fromkeys(DATA_KEYS + ["DATASET.ANSWER_VOCAB_SIZE", "DATASET.SEQ_LEN", "DATASET.MIN_SEQ_LEN",
                                     "NETWORK.BLIND", "NETWORK.NO_GROUNDING", "NETWORK.NO_OBJ_ATTENTION",
                                     "NETWORK.OUTPUT_CONV5", "NETWORK.VLBERT.object_word_embed_mode"], REFUSED)),
    # Config files only: every key is refused away from its default.
    "refcoco": {key: REFUSED for key, _ in leaf_keys(defaults("refcoco"))},
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
    from common.config_keys import DONE, task_key_status
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


def not_implemented(task, kind):
    return [(task, key) for key, status in api(task).KEY_STATUS.items() if status.kind == kind]


@pytest.mark.parametrize("task,key", [tk for task in TASKS for tk in not_implemented(task, WARNED)])
def test_warned_key_warns_naming_the_key(task, key):
    default = dict(leaf_keys(defaults(task)))[key]
    cfg = with_value(defaults(task), key, other_value(default))
    with pytest.warns(ConfigKeyWarning, match=r"^my\.yaml: {} = .*; the value is ignored$".format(key.replace(".", r"\."))):
        api(task).check_config(cfg, "my.yaml")


@pytest.mark.parametrize("task,key", [tk for task in TASKS for tk in not_implemented(task, REFUSED)])
def test_refused_key_stops_naming_the_key(task, key):
    default = dict(leaf_keys(defaults(task)))[key]
    cfg = with_value(defaults(task), key, other_value(default))
    with pytest.raises(ConfigError, match=r"^my\.yaml: {} = .*\(default .*\)$".format(key.replace(".", r"\."))):
        api(task).check_config(cfg, "my.yaml")


@pytest.mark.parametrize("task", TASKS)
def test_defaults_and_implemented_keys_pass_silently(task):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigKeyWarning)
        api(task).check_config(defaults(task))
        cfg = defaults(task)
        for key, status in api(task).KEY_STATUS.items():
            if status.kind == IMPLEMENTED:
                cfg = with_value(cfg, key, other_value(dict(leaf_keys(cfg))[key]))
        api(task).check_config(cfg)


def test_shipped_vcr_configs_warn_only_about_gpus_and_the_cache_root():
    for path in sorted(glob.glob(os.path.join(ROOT, "cfgs", "vcr", "*.yaml"))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            api("vcr").check_config(api("vcr").load_config(path), path)
        keys = sorted(str(w.message).split(": ")[1].split(" = ")[0] for w in caught)
        assert keys == ([] if path.endswith("demo_q2a_cpu.yaml") else ["DATASET.ROOT_PATH", "GPUS"]), path


def test_entry_points_refuse_and_warn_before_anything_runs(tmp_path):
    """Training: a refused value is one `error:` line (exit code 2) naming the key, before any data is read
    or any output written; a warned key is named on the way. Evaluation refuses before reading the checkpoint."""
    cfg = "cfgs/vcr/demo_q2a_cpu.yaml"
    out = subprocess.run([sys.executable, "vcr/train_end2end.py", "--cfg", cfg, "--model-dir", str(tmp_path), "--opts",
                          "TEST.TEST_EPOCH", "3", "DATASET.CACHE_MODE", "true", "DATASET.DATASET_PATH", "/no/data"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "ConfigKeyWarning: {}: TEST.TEST_EPOCH = 3: the test scripts take the checkpoint file".format(cfg) \
        in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: {}: DATASET.CACHE_MODE = True: not implemented (the reference's VCR data set refuses it too) "
        "(default False)".format(cfg))
    assert not os.listdir(str(tmp_path))

    refused = api("vcr").load_config(os.path.join(ROOT, cfg), ["DATASET.QA2R_AUG", "true"])
    with pytest.raises(ConfigError, match=r"^config: DATASET\.QA2R_AUG = True: not implemented"):
        val_correct(refused, str(tmp_path / "no.model"))


# ------------------------------------------------------------------------------------------------ #
# Values users write
# ------------------------------------------------------------------------------------------------ #
def test_lossless_coercions(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("GPUS: 0\nMODEL_PREFIX: 2020\nTRAIN:\n  END_EPOCH: 20.0\n  GRAD_ACCUMULATE_STEPS: '4'\n")
    cfg = api("vcr").load_config(str(path))
    assert (cfg.GPUS, cfg.MODEL_PREFIX, cfg.TRAIN.END_EPOCH, cfg.TRAIN.GRAD_ACCUMULATE_STEPS) == ("0", "2020", 20, 4)
    assert api("vcr").load_config(None, ["GPUS", "0,1"]).GPUS == "0,1"
    for opts, message in ((["TRAIN.END_EPOCH", "20.5"], "expected int, got float 20.5"),
                          (["TRAIN.END_EPOCH", "'ten'"], "expected int, got str 'ten'"),
                          (["TRAIN.FP16", "1"], "expected bool, got int 1"),
                          (["GPUS", "true"], "expected string, got bool True")):
        with pytest.raises(ConfigError, match=message):
            api("vcr").load_config(None, opts)


# ------------------------------------------------------------------------------------------------ #
# Effects of the keys the reference declared without reading
# ------------------------------------------------------------------------------------------------ #
def build(task, cfg_name, opts):
    cfg = api(task).load_config(os.path.join(ROOT, "cfgs", task, cfg_name), TINY + opts)
    torch.manual_seed(0)
    return cfg, importlib.import_module(task + ".modules").build_model(cfg)


def test_ans_loss_type_ce_and_bce_on_known_logits(monkeypatch):
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, -2.0]])
    label = torch.tensor([[1.0, 0.0, 0.3], [0.0, 0.6, 0.0]])  # VQA soft scores
    log_softmax = logits - logits.exp().sum(1, keepdim=True).log()
    expected = {
        "ce": -(label * log_softmax).sum(1).mean(),
        "bce": -(label * F.logsigmoid(logits) + (1 - label) * F.logsigmoid(-logits)).mean() * 3,
    }
    for kind in ("ce", "bce"):
        _, model = build("vqa", "base_4x16G_fp32.yaml", ["DATASET.ANSWER_VOCAB_SIZE", 3, "NETWORK.ANS_LOSS_TYPE", kind])
        monkeypatch.setattr(model, "_logits", lambda *inputs: logits)
        outputs, loss = model.train().train_forward(None, None, None, None, label)
        assert torch.allclose(outputs["ans_loss"], expected[kind]) and torch.allclose(loss, expected[kind])
    assert not torch.allclose(expected["ce"], expected["bce"])
    with pytest.raises(UserInputError, match="NETWORK.ANS_LOSS_TYPE: expected one of bce, ce, got 'focal'"):
        build("vqa", "base_4x16G_fp32.yaml", ["NETWORK.ANS_LOSS_TYPE", "focal"])


@pytest.mark.parametrize("frozen", [True, False])
def test_bert_frozen_leaves_bert_weights_unchanged_by_a_step(frozen):
    cfg, model = build("vcr", "base_q2a_4x16G_fp32.yaml", ["NETWORK.BERT_FROZEN", frozen, "TRAIN.OPTIMIZER", "SGD",
                                                           "TRAIN.LR", 0.1, "TRAIN.WD", 0.01])
    bert = model.vlbert._module
    names = {id(p): n for n, p in model.named_parameters()}
    language = {names[id(p)] for p in bert.language_parameters()}
    assert any(".encoder." in n for n in language) and any("word_embeddings" in n for n in language)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(cfg, model)
    _, loss = model.train()(*vcr_batch())
    loss.backward()
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert any(n.startswith("final_mlp.") for n in changed)
    if frozen:
        assert not changed & language
    else:
        assert {n for n in language if ".encoder." in n} <= changed


@pytest.mark.parametrize("visual_ln", [True, False])
def test_visual_scale_inits_change_the_forward(visual_ln):
    """The scales (LayerNorm gains with ``visual_ln``, as in the paper configs) start at the init values:
    both at 0 (the paper's), the answer scores do not depend on the image; at 1 they do."""
    batch = list(vcr_batch())
    other_image = list(batch)
    other_image[0] = batch[0].flip(-1)
    for init, depends_on_image in ((0.0, False), (1.0, True)):
        _, model = build("vcr", "base_q2a_4x16G_fp32.yaml", ["NETWORK.VLBERT.visual_ln", visual_ln,
                                                             "NETWORK.VLBERT.visual_scale_text_init", init,
                                                             "NETWORK.VLBERT.visual_scale_object_init", init])
        model.eval()
        bert = model.vlbert._module
        scales = (bert.visual_ln_text.weight, bert.visual_ln_object.weight) if visual_ln else \
            (bert.visual_scale_text, bert.visual_scale_object)
        assert all(torch.all(scale == init) for scale in scales)
        with torch.no_grad():
            scores = model(*batch[:7], batch[8])["label_logits"]
            flipped = model(*other_image[:7], other_image[8])["label_logits"]
        assert torch.equal(scores, flipped) != depends_on_image


def test_visual_scale_lr_mults_and_clip():
    cfg, model = build("vcr", "base_q2a_4x16G_fp32.yaml", [
        "TRAIN.OPTIMIZER", "SGD", "TRAIN.LR", 0.01, "TRAIN.MOMENTUM", 0.0, "TRAIN.WD", 0.0,
        "TRAIN.VISUAL_SCALE_TEXT_LR_MULT", 10.0, "TRAIN.VISUAL_SCALE_OBJECT_LR_MULT", 0.5,
        "TRAIN.VISUAL_SCALE_CLIP_GRAD_NORM", 0.25])
    bert = model.vlbert._module
    text_scale, object_scale = bert.visual_ln_text.weight, bert.visual_ln_object.weight  # visual_ln: the gains
    optimizer = build_optimizer(cfg, model)
    base = 0.01 * images_per_step(cfg, 1)
    text, obj = optimizer.param_groups[:2]
    assert text["params"] == [text_scale] and text["lr"] == pytest.approx(10 * base)
    assert obj["params"] == [object_scale] and obj["lr"] == pytest.approx(0.5 * base)
    assert text["max_grad_norm"] == obj["max_grad_norm"] == 0.25
    assert all(p is not text_scale and p is not object_scale for g in optimizer.param_groups[2:] for p in g["params"])

    start = text_scale.detach().clone(), object_scale.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    text_scale.grad.fill_(-3.0)  # norm 3 sqrt(H): clipped to norm 0.25
    object_scale.grad[0] = 0.1  # under the limit
    assert amp.LossScaler().step(optimizer).applied
    clipped = 0.25 / text_scale.numel() ** 0.5
    assert torch.allclose(text_scale, start[0] + 10 * base * clipped)
    assert torch.allclose(object_scale[0], start[1][0] - 0.5 * base * 0.1) and torch.equal(object_scale[1:], start[1][1:])

    # At the defaults the optimizer has the reference's groups: LR_MULT groups and the rest.
    cfg, model = build("vcr", "base_q2a_4x16G_fp32.yaml", [])
    assert len(build_optimizer(cfg, model).param_groups) == len(cfg.TRAIN.LR_MULT) + 1


def test_val_frequent_validates_every_n_epochs_and_after_the_last():
    model = Toy()

    class Const(EvalMetric):
        def update(self, outputs):
            pass

    validated = []

    def val_func(net, loader, metrics, label_index):
        metrics.reset()
        metrics.metrics[0].sum_metric, metrics.metrics[0].num_inst = 1.0, 1.0
        validated.append(len(validated))

    monitor = ValidationMonitor(val_func, None, CompositeEvalMetric([Const("Acc")]))
    epochs_seen = []

    def epoch_end(epoch, *args, **kwargs):
        epochs_seen.append((epoch, len(validated)))

    train(model, torch.optim.SGD(model.parameters(), lr=0.1), None, _batches(2, 2), None, None, 0, 5, None,
          epoch_end_callbacks=epoch_end, validation_monitor=monitor, val_frequent=2)
    # validations after epochs 1 and 3 ((e + 1) % 2 == 0) and after the last one, 4
    assert epochs_seen == [(0, 0), (1, 1), (2, 1), (3, 2), (4, 3)]
