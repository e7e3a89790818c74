"""Special tokens inside text and in the frozen-word-embedding table (issue: paper fidelity, parts 1-2).

1. A ``[PAD]`` id (0) inside a caption or passage is a token: every MLM label is scored on its own
   token's output row (the reference's ``text > 0`` mask dropped it and shifted the later rows).
2. With ``word_embedding_frozen``, the trainable special-word table starts from the *loaded* BERT rows.
"""
import importlib
import os

import pytest
import torch

from common.modeling.nlp.bert_loading import read_bert_weights
from common.modeling.visual_linguistic_bert import NUM_SPECIAL_WORDS
from tests import pretrain_fixtures
from tests.conftest import load_task
from tests.test_bert_loading import MINILM
from tests.test_modules import TINY, build, pretrain_batch

pytestmark = [pytest.mark.filterwarnings('ignore:NETWORK.*(BERT_MODEL_NAME|IMAGE_PRETRAINED) is empty'),
              pytest.mark.filterwarnings("ignore:CLASSIFIER_TYPE 'mlm'")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Odd content of web captions and corpus passages, each between ordinary words.
ODD = ['[PAD]', '[UNK]', '[CLS] [SEP]', '[PAD] [PAD]', '\U0001F436 dog', 'a\x07b\x1b c', 'caf\u00e9\u200b']
SMALL_VOCAB = TINY + ['NETWORK.VLBERT.vocab_size', len(pretrain_fixtures.VOCAB)]


def without_encoder_layers(model):
    """``model`` with its encoder layers removed: an output row then depends on its own token, position
    and segment only, so a shifted row is caught exactly, whatever the other tokens are."""
    model.vlbert.encoder.layer = torch.nn.ModuleList()
    return model


def encode(tokenizer, odd, filler=None):
    """``[CLS] the dog <odd> sits on the mat [SEP]`` as ids; ``filler`` replaces each odd token's id."""
    cls, sep = tokenizer.convert_tokens_to_ids(['[CLS]', '[SEP]'])
    odd_ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(odd))
    if filler is not None:
        odd_ids = [filler] * len(odd_ids)
    head = tokenizer.convert_tokens_to_ids(tokenizer.tokenize('the dog'))
    tail = tokenizer.convert_tokens_to_ids(tokenizer.tokenize('sits on the mat'))
    return [cls] + head + odd_ids + tail + [sep], len(head) + 1, len(head) + 1 + len(odd_ids)


def padded(rows, length, fill):
    return torch.tensor([row + [fill] * (length - len(row)) for row in rows])


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
    return pretrain_fixtures.tokenizer(tmp_path_factory.mktemp('vocab'))


def test_a_pad_word_in_text_keeps_id_0(tokenizer):
    """The premise: the tokenizer keeps a written ``[PAD]`` as id 0 inside the text."""
    ids, start, end = encode(tokenizer, '[PAD]')
    assert ids[start:end] == [0] and ids[-1] != 0


@pytest.mark.parametrize('odd', ODD)
@pytest.mark.parametrize('multitask', [False, True], ids=['caption', 'corpus passage'])
def test_mlm_rows_are_their_own_tokens_outputs(tokenizer, odd, multitask):
    """Each labelled position's MLM logits equal those of the same text with the odd tokens replaced by an
    ordinary word (rows depend only on their own token here), in a batch padded past both texts."""
    model = build('pretrain', 'base_e2e_16x16G_fp16.yaml', SMALL_VOCAB)
    if not multitask:
        model = importlib.import_module('pretrain.modules').ResNetVLBERTForPretraining(model.cfg)
    model = without_encoder_layers(model).eval()
    ordinary = tokenizer.convert_tokens_to_ids(['w7'])[0]
    odd_ids, start, end = encode(tokenizer, odd)
    plain_ids, _, _ = encode(tokenizer, odd, filler=ordinary)
    labelled = [i for i in range(1, len(odd_ids) - 1) if not start <= i < end]
    labels = [-1] * len(odd_ids)
    for i in labelled:
        labels[i] = odd_ids[i]
    length = len(odd_ids) + 3
    text = padded([odd_ids, plain_ids], length, 0)
    mlm_labels = padded([labels, labels], length, -1)
    image, boxes, im_info, _, rel, _, mvrc_ops, mvrc_labels = pretrain_batch()
    with torch.no_grad():
        if multitask:
            outputs, _ = model(image, boxes, im_info, pretrain_batch()[3], rel, pretrain_batch()[5], mvrc_ops,
                               mvrc_labels, text, mlm_labels)
            logits = outputs['mlm_logits_aux']
        else:
            outputs, _ = model(image, boxes, im_info, text, rel, mlm_labels, mvrc_ops, mvrc_labels)
            logits = outputs['mlm_logits']
    torch.testing.assert_close(logits[0, labelled], logits[1, labelled], rtol=0, atol=1e-5)


@pytest.mark.skipif(MINILM is None, reason='the MiniLM package (requirements-test) is not installed')
@pytest.mark.parametrize('task, cfg_file, extra', [
    ('vcr', 'vcr/demo_q2a_cpu.yaml', []),
    ('vqa', 'vqa/demo_cpu.yaml', ['NETWORK.CLASSIFIER_PRETRAINED', False]),
    ('refcoco', 'refcoco/demo_cpu.yaml', []),
    ('pretrain', 'pretrain/demo_e2e_cpu.yaml', []),
])
def test_frozen_word_embeddings_special_rows_start_from_the_loaded_bert(task, cfg_file, extra):
    config = load_task(task).load_config(
        os.path.join(ROOT, 'cfgs', cfg_file),
        ['NETWORK.BERT_MODEL_NAME', MINILM, 'NETWORK.IMAGE_PRETRAINED', '', 'NETWORK.IMAGE_NUM_LAYERS', 18] + extra)
    assert config.NETWORK.VLBERT.word_embedding_frozen
    torch.manual_seed(0)
    vlbert = importlib.import_module(task + '.modules').MODELS.build(config).vlbert
    vlbert = getattr(vlbert, '_module', vlbert)  # VCR wraps it in TimeDistributed
    weights_file = [f for f in os.listdir(MINILM) if f.endswith(('.safetensors', '.bin'))][0]
    loaded = read_bert_weights(os.path.join(MINILM, weights_file))['embeddings.word_embeddings.weight']
    assert torch.equal(vlbert.special_word_embeddings.weight.data, loaded[:NUM_SPECIAL_WORDS])
    assert torch.equal(vlbert.word_embeddings.weight.data, loaded)
