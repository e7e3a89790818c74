"""TRAIN.LABEL_SMOOTHING: the softmax answer losses of VCR and VQA ('ce') against
``F.cross_entropy(..., label_smoothing=)``, bit-identical losses at 0, and the tasks whose loss is
not a softmax cross-entropy refusing the key through their real entry points."""
import os

import pytest
import torch
import torch.nn.functional as F

from vqa.modules.resnet_vlbert_for_vqa import smoothed_soft_targets
from tests.test_modules import TINY, build, vcr_batch
from tests.conftest import load_task
from tests.tiny_vcr import ROOT, run_script

pytestmark = [pytest.mark.filterwarnings('ignore:NETWORK.*(BERT_MODEL_NAME|IMAGE_PRETRAINED) is empty'),
              pytest.mark.filterwarnings("ignore:CLASSIFIER_TYPE 'mlm'")]

VCR_SOFTMAX = TINY + ['NETWORK.CLASSIFIER_SIGMOID', False, 'NETWORK.ENABLE_CNN_REG_LOSS', False]


def vcr_loss(smoothing):
    model = build('vcr', 'base_q2a_4x16G_fp32.yaml', VCR_SOFTMAX + ['TRAIN.LABEL_SMOOTHING', smoothing]).train()
    outputs, loss = model(*vcr_batch())
    return outputs, loss


def test_vcr_answer_loss_is_the_label_smoothed_cross_entropy():
    outputs, loss = vcr_loss(0.1)
    logits, label = outputs['label_logits'].detach(), outputs['label']
    expected = F.cross_entropy(logits, label, label_smoothing=0.1)
    assert torch.allclose(outputs['ans_loss'], expected, rtol=1e-6, atol=0) and torch.allclose(loss, expected)
    # by hand: 0.9 x CE + 0.1 x mean over choices of -log p
    logp = F.log_softmax(logits, 1)
    by_hand = (0.9 * -logp[torch.arange(2), label] + 0.1 * -logp.mean(1)).mean()
    assert torch.allclose(outputs['ans_loss'], by_hand, rtol=1e-6)
    assert not torch.allclose(expected, F.cross_entropy(logits, label), rtol=1e-3)


def test_vcr_loss_at_zero_is_the_plain_cross_entropy_bit_for_bit():
    outputs, _ = vcr_loss(0.0)
    assert torch.equal(outputs['ans_loss'], F.cross_entropy(outputs['label_logits'].detach(), outputs['label']))


def vqa_loss(label, smoothing, loss_type='ce'):
    model = build('vqa', 'base_4x16G_fp32.yaml', TINY + ['DATASET.ANSWER_VOCAB_SIZE', 7, 'NETWORK.ANS_LOSS_TYPE',
                                                        loss_type, 'TRAIN.LABEL_SMOOTHING', smoothing]).train()
    image = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    boxes = torch.full((2, 4, 4 + 2048), -2.0)
    boxes[0, :3, :4] = torch.tensor([[0, 0, 30, 30], [5, 5, 60, 60], [0, 0, 0, 0]])
    boxes[1, :1, :4] = torch.tensor([[1, 1, 40, 20]])
    boxes[:, :3, 4:] = torch.rand(2, 3, 2048, generator=torch.Generator().manual_seed(2))
    question = torch.tensor([[150, 151, 152, 0], [160, 0, 0, 0]])
    im_info = torch.tensor([[64., 64, 1, 1]] * 2)
    outputs, loss = model(image, boxes, im_info, question, label)
    return outputs['label_logits'].detach(), outputs['ans_loss'], loss


def test_vqa_ce_loss_equals_label_smoothed_cross_entropy_for_rows_summing_to_one():
    label = torch.zeros(2, 7)
    label[0, 3] = 1.0                          # one answer
    label[1, 1], label[1, 4] = 0.4, 0.6        # soft scores summing to 1
    logits, ans_loss, loss = vqa_loss(label, 0.2)
    expected = F.cross_entropy(logits, label, label_smoothing=0.2)
    assert torch.allclose(ans_loss, expected, rtol=1e-6, atol=0) and torch.allclose(loss, expected)
    assert not torch.allclose(expected, F.cross_entropy(logits, label), rtol=1e-3)


def test_vqa_ce_smoothing_keeps_each_rows_target_mass():
    label = torch.zeros(2, 7)                  # row 0: no answer in the vocabulary; row 1: mass 1.6
    label[1, 2], label[1, 5] = 1.0, 0.6
    logits, ans_loss, _ = vqa_loss(label, 0.2)
    logp = F.log_softmax(logits, 1)
    row1 = -(0.8 * label[1] * logp[1]).sum() + 1.6 * 0.2 * -logp[1].mean()
    assert torch.allclose(ans_loss, row1 / 2, rtol=1e-6)  # row 0 adds nothing, as without smoothing
    # torch's smoothing would add 0.2 of uniform mass to the empty row (and to row 1 whatever its mass)
    assert not torch.allclose(ans_loss, F.cross_entropy(logits, label, label_smoothing=0.2), rtol=1e-3)
    assert torch.equal(smoothed_soft_targets(label, 0.0), label)


def test_vqa_ce_loss_at_zero_is_unchanged_bit_for_bit():
    label = torch.zeros(2, 7)
    label[0, 3], label[1, 1] = 1.0, 0.3
    logits, ans_loss, _ = vqa_loss(label, 0.0)
    assert torch.equal(ans_loss, F.cross_entropy(logits, label))


VCR = (os.path.join(ROOT, "vcr", "train_end2end.py"), os.path.join(ROOT, "cfgs", "vcr", "base_q2a_4x16G_fp16.yaml"))
VQA = (os.path.join(ROOT, "vqa", "train_end2end.py"), os.path.join(ROOT, "cfgs", "vqa", "base_4x16G_fp32.yaml"))
REFCOCO = (os.path.join(ROOT, "refcoco", "train_end2end.py"),
           os.path.join(ROOT, "cfgs", "refcoco", "base_gt_boxes_4x16G.yaml"))
PRETRAIN = (os.path.join(ROOT, "pretrain", "train_end2end.py"),
            os.path.join(ROOT, "cfgs", "pretrain", "base_e2e_16x16G_fp16.yaml"))
REFUSALS = [
    (VQA, [], "NETWORK.ANS_LOSS_TYPE 'bce' is a binary cross-entropy per answer; label smoothing applies to the "
              "softmax cross-entropy (ANS_LOSS_TYPE 'ce') only"),
    (VCR, [], "NETWORK.CLASSIFIER_SIGMOID makes the answer loss a binary cross-entropy per choice; label smoothing "
              "applies to the softmax cross-entropy (CLASSIFIER_SIGMOID false) only"),
    (REFCOCO, [], "the RefCOCO+ loss is a binary cross-entropy per box, not a softmax cross-entropy, so there is "
                  "no label distribution to smooth"),
    (PRETRAIN, [], "the pretraining losses (masked language / region modelling, relationship) are not smoothed "
                   "here; label smoothing applies to the answer losses of VCR and VQA ('ce')"),
]


@pytest.mark.parametrize("entry,opts,reason", REFUSALS, ids=["vqa-bce", "vcr-sigmoid", "refcoco", "pretrain"])
def test_tasks_without_a_softmax_loss_refuse_the_key_at_the_entry_point(tmp_path, capsys, entry, opts, reason):
    (script, cfg) = entry
    code = run_script(script, ["--cfg", cfg, "--model-dir", str(tmp_path), "--opts", "TRAIN.LABEL_SMOOTHING", "0.1"]
                      + opts)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert lines[-1] == "error: {}: TRAIN.LABEL_SMOOTHING = 0.1: {} (default 0.0)".format(cfg, reason)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("task,cfg,opts", [
    ("vqa", "base_4x16G_fp32.yaml", ["NETWORK.ANS_LOSS_TYPE", "ce"]),
    ("vcr", "base_q2a_4x16G_fp16.yaml", ["NETWORK.CLASSIFIER_SIGMOID", "false"]),
])
def test_softmax_losses_accept_the_key(task, cfg, opts):
    api = load_task(task)
    cfg = api.load_config(os.path.join(ROOT, "cfgs", task, cfg), opts + ["TRAIN.LABEL_SMOOTHING", "0.1"])
    api.check_config(cfg)  # no ConfigError
    assert cfg.TRAIN.LABEL_SMOOTHING == 0.1
