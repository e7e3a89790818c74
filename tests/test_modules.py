"""Task models: checkpoint keys/shapes and sizes of the paper configs, forward contracts, losses, registry."""
import json
import os

import pytest
import torch
import torch.nn.functional as F

from pretrain.losses import masked_lm_loss, soft_cross_entropy
from common.modeling.vlbert_module import collect_obj_reps, pack_text_pair
from tests.conftest import LEGACY, load_task

CFGS = os.path.join(LEGACY, 'cfgs')
NO_WEIGHTS = ['NETWORK.BERT_MODEL_NAME', '', 'NETWORK.IMAGE_PRETRAINED', '']
TINY = NO_WEIGHTS + ['NETWORK.IMAGE_NUM_LAYERS', 18, 'NETWORK.IMAGE_FINAL_DIM', 32,
                     'NETWORK.VLBERT.hidden_size', 32, 'NETWORK.VLBERT.visual_size', 32,
                     'NETWORK.VLBERT.num_hidden_layers', 2, 'NETWORK.VLBERT.num_attention_heads', 4,
                     'NETWORK.VLBERT.intermediate_size', 64, 'NETWORK.VLBERT.vocab_size', 200,
                     'NETWORK.VLBERT.max_position_embeddings', 64]

pytestmark = [pytest.mark.filterwarnings('ignore:NETWORK.*(BERT_MODEL_NAME|IMAGE_PRETRAINED) is empty'),
              pytest.mark.filterwarnings("ignore:CLASSIFIER_TYPE 'mlm'")]


def build(task, cfg_file, opts):
    import importlib
    config = load_task(task).load_config(os.path.join(CFGS, task, cfg_file), opts)
    torch.manual_seed(0)
    return importlib.import_module(task + '.modules').MODELS.build(config)


def num_parameters(model):
    # The reference sizes count each parameter once (res5 is shared by two submodules, the MLM decoder is tied).
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- checkpoint compatibility

def test_vcr_base_state_dict_equals_reference():
    with open(os.path.join(LEGACY, 'vcr_base_state_dict_shapes.json')) as f:
        expected = json.load(f)['cfgs/vcr/base_q2a_4x16G_fp32.yaml']
    model = build('vcr', 'base_q2a_4x16G_fp32.yaml', NO_WEIGHTS)
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == expected
    assert num_parameters(model) == 155787922


@pytest.mark.parametrize('task, cfg_file, size', [
    ('vqa', 'base_4x16G_fp32.yaml', 115041849),
    ('pretrain', 'base_e2e_16x16G_fp16.yaml', 156989627),
])
def test_paper_config_sizes(task, cfg_file, size):
    assert num_parameters(build(task, cfg_file, NO_WEIGHTS)) == size


@pytest.mark.slow
def test_vcr_large_size():
    assert num_parameters(build('vcr', 'large_q2a_4x16G_fp16.yaml', NO_WEIGHTS)) == 382978194


def test_vcr_released_style_checkpoint_loads_strictly():
    """A state dict saved under DataParallel ('module.' prefix) loads strictly once the prefix is removed."""
    model = build('vcr', 'base_q2a_4x16G_fp32.yaml', TINY)
    saved = {'module.' + k: v.clone() for k, v in model.state_dict().items()}
    other = build('vcr', 'base_q2a_4x16G_fp32.yaml', TINY)
    other.load_state_dict({k[len('module.'):]: v for k, v in saved.items()}, strict=True)


# ---------------------------------------------------------------- builders and errors

def test_unknown_module_lists_known_ones():
    from vcr.task import TASK as VCR_TASK
    from vcr.modules import MODELS
    config = VCR_TASK.load_config(os.path.join(CFGS, 'vcr', 'base_q2a_4x16G_fp32.yaml'), TINY + ['MODULE', 'Nope'])
    with pytest.raises(KeyError, match="'Nope'.*known: ResNetVLBERT"):
        MODELS.build(config)


def test_random_init_warns_and_missing_bert_folder_is_named():
    with pytest.warns(UserWarning, match='BERT_MODEL_NAME is empty'):
        build('vcr', 'base_q2a_4x16G_fp32.yaml', TINY)
    with pytest.raises(FileNotFoundError, match='/no/such/bert'):
        build('vcr', 'base_q2a_4x16G_fp32.yaml', TINY + ['NETWORK.BERT_MODEL_NAME', '/no/such/bert'])


# ---------------------------------------------------------------- VCR forward contract

def vcr_batch(num_boxes=5):
    g = torch.Generator().manual_seed(0)
    image = torch.randn(2, 3, 64, 80, generator=g)
    boxes = torch.full((2, num_boxes, 5), -1.0)
    boxes[0, :3] = torch.tensor([[0, 0, 30, 30, 1], [10, 10, 60, 50, 5], [0, 0, 0, 0, 0]])  # incl. an empty box
    boxes[1, :2] = torch.tensor([[5, 5, 20, 40, 2], [0, 0, 79, 63, 3]])
    masks = torch.ones(2, num_boxes, 14, 14)
    question = torch.zeros(2, 6, 2, dtype=torch.long)
    question[..., 1] = -1
    question[0, :5, 0] = torch.randint(110, 200, (5,), generator=g)
    question[0, 1, 1] = 0
    question[1, :3, 0] = 150
    answers = torch.zeros(2, 4, 4, 2, dtype=torch.long)
    answers[..., 1] = -1
    answers[:, :, :2, 0] = 120
    answers[0, 1, 2:, 0] = 130
    answers[1, 2, 0, 1] = 1
    im_info = torch.tensor([[80., 64, 1, 1], [80, 64, 1, 1]])
    return image, boxes, masks, question, None, answers, None, torch.tensor([1, 2]), im_info


@pytest.mark.parametrize('opts', [
    [],
    ['NETWORK.CNN_LOSS_TOP', False, 'NETWORK.CLASSIFIER_SIGMOID', False, 'NETWORK.CLASSIFIER_TYPE', '2fc'],
    ['NETWORK.VLBERT.object_word_embed_mode', 1, 'NETWORK.ANSWER_FIRST', True],
    ['NETWORK.VLBERT.object_word_embed_mode', 3, 'NETWORK.QA_ONE_SENT', True],
    ['NETWORK.BLIND', True],
])
def test_vcr_train_and_inference(opts):
    model = build('vcr', 'base_q2a_4x16G_fp32.yaml', TINY + opts).train()
    batch = vcr_batch()
    outputs, loss = model(*batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert outputs['label_logits'].shape == (2, 4) and outputs['label'].tolist() == [1, 2]
    expected = {'label_logits', 'label', 'ans_loss'}
    if model.cfg.NETWORK.CLASSIFIER_SIGMOID:
        expected.add('positive_fraction')
        assert outputs['positive_fraction'].item() == 0.25
    if model.cfg.NETWORK.ENABLE_CNN_REG_LOSS and not model.cfg.NETWORK.BLIND:
        expected.add('cnn_regularization_loss')
    assert set(outputs) == expected
    model.eval()
    with torch.no_grad():
        inference = model(*batch[:7], batch[8])
    assert set(inference) == {'label_logits'} and inference['label_logits'].shape == (2, 4)


def test_vcr_sigmoid_loss_value():
    model = build('vcr', 'base_q2a_4x16G_fp32.yaml',
                  TINY + ['NETWORK.CLASSIFIER_SIGMOID_LOSS_POSITIVE_WEIGHT', 3.0, 'NETWORK.ENABLE_CNN_REG_LOSS', False])
    outputs, loss = model.train()(*vcr_batch())
    logits = outputs['label_logits'].detach()
    target = F.one_hot(torch.tensor([1, 2]), 4).float()
    weight = 1 + 2 * target
    expected = (3 + 1) / (2 * 3) * F.binary_cross_entropy_with_logits(logits, target, weight=weight)
    assert torch.allclose(outputs['ans_loss'], expected) and torch.allclose(loss, expected)


# fp16 is slow: the CPU has no fp16 convolution backward kernel but the naive one (40 s for this ResNet-18 at
# 64 x 80); fp16 is a GPU dtype, whose forward and training every task runs in tests/test_fake_cuda.py.
@pytest.mark.parametrize('dtype', [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
def test_vcr_autocast_forward_backward_finite(dtype):
    model = build('vcr', 'base_q2a_4x16G_fp32.yaml', TINY).train()
    with torch.autocast('cpu', dtype=dtype):
        _, loss = model(*vcr_batch())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ---------------------------------------------------------------- VQA and pretraining

def test_vqa_train_and_inference():
    model = build('vqa', 'base_4x16G_fp32.yaml', TINY + ['DATASET.ANSWER_VOCAB_SIZE', 7]).train()
    image = torch.randn(2, 3, 64, 64)
    # The paper's VQA config uses precomputed box features: boxes are [x1, y1, x2, y2, 2048 features].
    boxes = torch.full((2, 4, 4 + 2048), -2.0)
    boxes[0, :3, :4] = torch.tensor([[0, 0, 30, 30], [5, 5, 60, 60], [0, 0, 0, 0]])
    boxes[1, :1, :4] = torch.tensor([[1, 1, 40, 20]])
    boxes[:, :3, 4:] = torch.rand(2, 3, 2048)
    question = torch.tensor([[150, 151, 152, 0], [160, 0, 0, 0]])
    label = torch.zeros(2, 7)
    label[0, 3] = 1.0
    label[1, 1] = 0.3
    im_info = torch.tensor([[64., 64, 1, 1]] * 2)
    outputs, loss = model(image, boxes, im_info, question, label)
    loss.backward()
    assert set(outputs) == {'label_logits', 'label', 'ans_loss'} and outputs['label_logits'].shape == (2, 7)
    expected = F.binary_cross_entropy_with_logits(outputs['label_logits'].detach(), label) * 7
    assert torch.allclose(loss, expected)
    assert model.eval()(image, boxes, im_info, question)['label_logits'].shape == (2, 7)


def pretrain_batch(precomputed=False):
    g = torch.Generator().manual_seed(0)
    boxes = torch.full((2, 4, 4 + (2048 if precomputed else 0)), -2.0)
    boxes[0, :2, :4] = torch.tensor([[0, 0, 30, 30], [5, 5, 60, 60]])
    boxes[1, :3, :4] = torch.tensor([[1, 1, 40, 20], [0, 0, 63, 63], [0, 0, 0, 0]])
    if precomputed:
        boxes[:, :3, 4:] = torch.rand(2, 3, 2048, generator=g)
    text = torch.tensor([[101, 150, 103, 102, 0], [101, 160, 161, 103, 102]])
    mlm_labels = torch.full((2, 5), -1)
    mlm_labels[0, 2] = 151
    mlm_labels[1, 3] = 162
    mvrc_ops = torch.zeros(2, 4, dtype=torch.long)
    mvrc_ops[1, 1] = 1
    mvrc_labels = torch.zeros(2, 4, 1601)
    mvrc_labels[1, 1, 7] = 1.0
    return (torch.randn(2, 3, 64, 64, generator=g), boxes, torch.tensor([[64., 64, 1, 1]] * 2), text,
            torch.tensor([1, 0]), mlm_labels, mvrc_ops, mvrc_labels)


def test_pretraining_multitask_train():
    model = build('pretrain', 'base_e2e_16x16G_fp16.yaml', TINY).train()
    aux_text = torch.tensor([[101, 170, 103, 102, 0, 0, 0]])
    aux_labels = torch.full((1, 7), -1)
    aux_labels[0, 2] = 171
    outputs, loss = model(*pretrain_batch(), aux_text, aux_labels)
    loss.backward()
    assert outputs['mlm_logits_wvc'].shape == (2, 7, 200) and outputs['mlm_label_aux'].shape == (1, 7)
    assert outputs['mvrc_logits'].shape == (2, 4, 1601) and outputs['relationship_logits'] is None
    expected = (outputs['mlm_loss_wvc'] + outputs['mlm_loss_aux'] + outputs['mvrc_loss']).detach()
    assert torch.allclose(loss.detach(), expected)
    assert torch.allclose(outputs['mlm_loss_aux'],
                          F.cross_entropy(outputs['mlm_logits_aux'][0, 2:3].float(), torch.tensor([171])))


def test_pretraining_precomputed_features():
    model = build('pretrain', 'base_prec_4x16G_fp32.yaml', TINY)
    assert type(model).__name__ == 'ResNetVLBERTForPretrainingMultitask'
    single = __import__('pretrain.modules', fromlist=['x']).ResNetVLBERTForPretraining(model.cfg)
    outputs, loss = single.train()(*pretrain_batch(precomputed=True))
    loss.backward()
    assert {'relationship_loss', 'mlm_loss', 'mvrc_loss'} <= set(outputs) and torch.isfinite(loss)
    assert outputs['mlm_logits'].shape == (2, 5, 200)


# ---------------------------------------------------------------- shared helpers

def test_pack_text_pair_layout():
    first = torch.tensor([[11, 12, 0], [13, 0, 0]])
    second = torch.tensor([[21, 0], [22, 23]])
    ids, types, tags, mask, second_end = pack_text_pair(first, first + 100, first > 0, second, second + 100,
                                                        second > 0, cls_id=1, sep_id=2)
    assert ids.tolist() == [[1, 11, 12, 2, 21, 2], [1, 13, 2, 22, 23, 2]]
    assert types.tolist() == [[0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1]]
    assert tags.tolist() == [[0, 111, 112, 0, 121, 0], [0, 113, 0, 122, 123, 0]]
    assert mask.all() and second_end.tolist() == [4, 4]
    ids, types, _, mask, _ = pack_text_pair(first, first, first > 0, second, second, second > 0, 1, 2,
                                            one_sentence=True)
    assert ids.tolist() == [[1, 11, 12, 21, 2], [1, 13, 22, 23, 2]] and not types.any()


def test_collect_obj_reps_gathers_per_sample():
    reps = torch.arange(2 * 3 * 2, dtype=torch.float).view(2, 3, 2)
    tags = torch.tensor([[[2, -1]], [[1, 0]]])
    out = collect_obj_reps(tags, reps)
    assert out.shape == (2, 1, 2, 2)
    assert out[0, 0].tolist() == [reps[0, 2].tolist(), reps[0, 0].tolist()]
    assert out[1, 0].tolist() == [reps[1, 1].tolist(), reps[1, 0].tolist()]


def test_losses_match_definitions():
    logits = torch.randn(3, 5)
    target = torch.tensor([[0, 0.5, 0.5, 0, 0], [0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0]])
    expected = -(F.log_softmax(logits, 1) * target).sum(1)[[0, 2]].mean()
    assert torch.allclose(soft_cross_entropy(logits, target), expected)
    mlm_logits = torch.randn(2, 3, 5)
    labels = torch.tensor([[1, -1, 2], [-1, -1, -1]])
    assert torch.allclose(masked_lm_loss(mlm_logits, labels, False),
                          F.cross_entropy(mlm_logits.view(-1, 5), labels.view(-1), ignore_index=-1))
    per_sample = F.cross_entropy(mlm_logits[0, [0, 2]], torch.tensor([1, 2]))
    assert torch.allclose(masked_lm_loss(mlm_logits, labels, True), per_sample, atol=1e-3)


def test_vcr_without_pooler_is_a_config_error():
    from common.errors import UserInputError
    with pytest.raises(UserInputError, match=r"NETWORK\.VLBERT\.with_pooler: the VCR answer classifier reads"):
        build('vcr', 'base_q2a_4x16G_fp32.yaml', TINY + ['NETWORK.VLBERT.with_pooler', False])
