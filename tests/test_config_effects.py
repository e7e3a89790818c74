"""Config values users write (lossless coercions) and the effect of the keys that the reference release
declared without reading: NETWORK.BERT_FROZEN, NETWORK.ANS_LOSS_TYPE, the visual scales (init values, LR
multipliers, clipping) and VAL_FREQUENT."""
import importlib
import os

import pytest
import torch
import torch.nn.functional as F

from common import amp
from common.hooks.validation_monitor import ValidationMonitor
from common.config import ConfigError
from common.errors import UserInputError
from common.metrics.composite_eval_metric import CompositeEvalMetric
from common.metrics.eval_metric import EvalMetric
from common.optim import build_optimizer, images_per_step
from common.trainer import Trainer
from tests.conftest import ROOT, load_task
from tests.test_modules import TINY, vcr_batch
from tests.test_trainer import OnEpoch, Toy, _batches

pytestmark = [pytest.mark.filterwarnings('ignore:NETWORK.*(BERT_MODEL_NAME|IMAGE_PRETRAINED) is empty')]


# ------------------------------------------------------------------------------------------------ #
# Values users write
# ------------------------------------------------------------------------------------------------ #
def test_lossless_coercions(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("GPUS: 0\nMODEL_PREFIX: 2020\nTRAIN:\n  END_EPOCH: 20.0\n  GRAD_ACCUMULATE_STEPS: '4'\n")
    cfg = load_task("vcr").load_config(str(path))
    assert (cfg.GPUS, cfg.MODEL_PREFIX, cfg.TRAIN.END_EPOCH, cfg.TRAIN.GRAD_ACCUMULATE_STEPS) == ("0", "2020", 20, 4)
    assert load_task("vcr").load_config(None, ["GPUS", "0,1"]).GPUS == "0,1"
    for opts, message in ((["TRAIN.END_EPOCH", "20.5"], "expected int, got float 20.5"),
                          (["TRAIN.END_EPOCH", "'ten'"], "expected int, got str 'ten'"),
                          (["TRAIN.FP16", "1"], "expected bool, got int 1"),
                          (["GPUS", "true"], "expected string, got bool True")):
        with pytest.raises(ConfigError, match=message):
            load_task("vcr").load_config(None, opts)


# ------------------------------------------------------------------------------------------------ #
# Effects of the keys the reference declared without reading
# ------------------------------------------------------------------------------------------------ #
def build(task, cfg_name, opts):
    cfg = load_task(task).load_config(os.path.join(ROOT, "cfgs", task, cfg_name), TINY + opts)
    torch.manual_seed(0)
    return cfg, importlib.import_module(task + ".modules").MODELS.build(cfg)


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

    monitor = ValidationMonitor(val_func, None, CompositeEvalMetric([Const("Acc")]), val_frequent=2)
    epochs_seen = []
    record = OnEpoch(lambda ctx: epochs_seen.append((ctx.epoch, len(validated))))
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _batches(2, 2), hooks=[monitor, record]).train(0, 5)
    # validations after epochs 1 and 3 ((e + 1) % 2 == 0) and after the last one, 4
    assert epochs_seen == [(0, 0), (1, 1), (2, 1), (3, 2), (4, 3)]
