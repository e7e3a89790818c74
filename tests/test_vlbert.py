"""Visual-linguistic BERT: encoder equivalence with pytorch_pretrained_bert, SDPA vs eager attention,
input layout, mixed precision, activation checkpointing, heads."""
import pytest
import torch
from pytorch_pretrained_bert.modeling import BertConfig, BertEncoder as ReferenceEncoder
from yacs.config import CfgNode

from common.modeling.nlp.modeling import BertEncoder, attention_bias
from common.modeling.nlp.time_distributed import TimeDistributed
from common.modeling.visual_linguistic_bert import NUM_SPECIAL_WORDS, VisualLinguisticBert, VisualLinguisticBertForPretraining

BERT_KEYS = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, hidden_act='gelu',
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=64,
                 type_vocab_size=3, initializer_range=0.02)


def vlbert_config(**overrides):
    cfg = CfgNode(dict(BERT_KEYS, vocab_size=1200, visual_size=32, visual_ln=True, visual_scale_text_init=0.5,
                       visual_scale_object_init=0.5, word_embedding_frozen=False, obj_pos_id_relative=True,
                       with_pooler=True, position_padding_idx=-1, visual_region_classes=1601,
                       pos_embedding_frozen=False))
    cfg.merge_from_list([x for kv in overrides.items() for x in kv])
    return cfg


def encoders():
    torch.manual_seed(0)
    reference = ReferenceEncoder(BertConfig(100, **BERT_KEYS)).eval()
    ours = BertEncoder(CfgNode(BERT_KEYS)).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    return reference, ours


def padded_batch():
    hidden = torch.randn(3, 10, 32)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2, 2:] = False
    return hidden, mask


def test_encoder_matches_pytorch_pretrained_bert_with_padding():
    reference, ours = encoders()
    hidden, mask = padded_batch()
    bias = attention_bias(mask)
    with torch.no_grad():
        expected = reference(hidden, bias, output_all_encoded_layers=True)
        got = ours(hidden, bias, output_all_encoded_layers=True)
    assert len(got) == len(expected) == 3
    for e, g in zip(expected, got):
        assert (e[mask] - g[mask]).abs().max().item() < 1e-5
        assert g[~mask].abs().max() == 0  # padded positions are skipped (BERT's values there mean nothing)


def test_encoder_matches_pytorch_pretrained_bert_without_padding():
    reference, ours = encoders()
    hidden = torch.randn(2, 9, 32)
    bias = attention_bias(torch.ones(2, 9, dtype=torch.bool))
    with torch.no_grad():
        assert (reference(hidden, bias)[-1] - ours(hidden, bias)[-1]).abs().max().item() < 1e-5


def test_sdpa_and_eager_attention_agree_in_outputs_and_gradients():
    _, ours = encoders()
    hidden, mask = padded_batch()
    bias = attention_bias(mask)
    results = []
    for eager in (False, True):
        ours.zero_grad()
        x = hidden.clone().requires_grad_(True)
        out = ours(x, bias, output_all_encoded_layers=False, output_attention_probs=eager)
        last = (out[0] if eager else out)[-1]
        last.pow(2).sum().backward()
        results.append((last.detach(), x.grad, ours.layer[0].attention.self.query.weight.grad.clone()))
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_attention_probs_ignore_padded_keys_and_sum_to_one():
    _, ours = encoders()
    hidden, mask = padded_batch()
    _, probs = ours(hidden, attention_bias(mask), output_attention_probs=True)
    assert len(probs) == 3 and probs[0].shape == (3, 4, 10, 10)
    for p in probs:
        assert torch.allclose(p.sum(-1), torch.ones(3, 4, 10))
        assert p[1, :, :, 6:].max() < 1e-30 and p[2, :, :, 2:].max() < 1e-30


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_fully_padded_rows_stay_finite_in_half_precision(dtype):
    _, ours = encoders()
    hidden, mask = padded_batch()
    mask[0] = False  # a row whose keys are all masked
    out = ours.to(dtype)(hidden.to(dtype), attention_bias(mask, dtype), output_all_encoded_layers=False)[-1]
    assert torch.isfinite(out).all()


@pytest.mark.parametrize('mode', ['autocast', 'half'])
def test_attention_probs_path_stays_finite_when_raw_scores_pass_fp16_max(mode):
    """Raw q.k of ~1.6e5 (past fp16's 65504) but scaled scores of ~2e4: both attention paths must
    stay finite and agree with each other and the fp32 result within fp16 tolerance (the scores
    themselves are only good to fp16's spacing of 16 there, so the probabilities are not compared)."""
    from common.modeling.nlp.modeling import BertSelfAttention
    torch.manual_seed(0)
    layer = BertSelfAttention(CfgNode(dict(BERT_KEYS, hidden_size=128, num_attention_heads=2,
                                           attention_probs_dropout_prob=0.0))).eval()  # head size 64
    with torch.no_grad():
        for lin in (layer.query, layer.key):
            lin.weight.copy_(torch.eye(128) * 50.0)
            lin.bias.zero_()
    hidden = 1.0 + 0.01 * torch.randn(2, 6, 128)  # q = k = ~50: raw q.k = 64 * 2500 = 1.6e5 per head
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    bias = attention_bias(mask)
    q = layer.query(hidden)[0, 0, :64]
    assert (q @ q).item() > 65504 and (q @ q).item() / 8 < 65504
    reference, _ = layer(hidden, bias)
    results = {}
    for eager in (False, True):
        if mode == 'autocast':
            with torch.autocast('cpu', dtype=torch.float16):
                results[eager] = layer(hidden, bias, output_attention_probs=eager)
        else:
            results[eager] = layer.half()(hidden.half(), bias.half(), output_attention_probs=eager)
            layer.float()
    (fused, _), (eager_out, probs) = results[False], results[True]
    assert fused.dtype == eager_out.dtype == torch.float16
    for out in (fused, eager_out, probs):
        assert torch.isfinite(out).all()
    assert torch.allclose(eager_out.float(), fused.float(), atol=2e-2, rtol=1e-2)
    assert torch.allclose(eager_out.float(), reference, atol=2e-2, rtol=1e-2)
    assert torch.allclose(probs.float().sum(-1), torch.ones(2, 2, 6), atol=1e-3)


def vl_inputs(batch=3, text_len=7, num_objects=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    text_ids = torch.randint(1, 1200, (batch, text_len), generator=g)
    text_mask = torch.zeros(batch, text_len, dtype=torch.bool)
    for b, n in enumerate([7, 3, 5][:batch]):
        text_mask[b, :n] = True
    text_ids[~text_mask] = 0
    types = torch.zeros(batch, text_len, dtype=torch.long)
    types[:, 2:] = 1
    text_visual = torch.randn(batch, text_len, 32, generator=g)
    object_vl = torch.randn(batch, num_objects, 64, generator=g)
    object_mask = torch.zeros(batch, num_objects, dtype=torch.bool)
    for b, n in enumerate([2, 4, 0][:batch]):
        object_mask[b, :n] = True
    return text_ids, types, text_visual, text_mask, object_vl, object_mask


def test_embedding_layout_matches_paper():
    """Text, then RoIs at one shared position, then [END]; segment 2 for RoIs and [END]."""
    torch.manual_seed(0)
    model = VisualLinguisticBert(vlbert_config()).eval()
    inputs = vl_inputs()
    text_ids, types, text_visual, text_mask, object_vl, object_mask = inputs
    embeddings, mask, is_text, is_object = model.embedding(*inputs)
    # Packed lengths: text + RoIs + [END] = 7 + 2 + 1, 3 + 4 + 1, 5 + 0 + 1.
    assert embeddings.shape == (3, 10, 32)
    assert mask.sum(1).tolist() == [10, 8, 6]

    b = 1  # 3 text tokens, 4 RoIs, [END] at 7
    ln_t, ln_o = model.visual_ln_text, model.visual_ln_object
    text = model.word_embeddings(text_ids[b, :3]) + ln_t(text_visual[b, :3]) \
        + model.position_embeddings.weight[:3] + model.token_type_embeddings(types[b, :3])
    objects = object_vl[b, :4, 32:] + ln_o(object_vl[b, :4, :32]) + model.position_embeddings.weight[3] \
        + model.token_type_embeddings.weight[2]
    end = model.end_embedding.weight[0] + model.position_embeddings.weight[4] + model.token_type_embeddings.weight[2]
    expected = model.embedding_LayerNorm(torch.cat((text, objects, end[None])))
    assert torch.allclose(embeddings[b, :8], expected, atol=1e-6)
    assert is_text[b].tolist() == [True] * 3 + [False] * 7
    assert is_object[b].tolist() == [False] * 3 + [True] * 4 + [False] * 3


def test_text_and_object_outputs_are_unpacked_to_input_layout():
    model = VisualLinguisticBert(vlbert_config()).eval()
    inputs = vl_inputs()
    text, objects, pooled = model(*inputs, output_all_encoded_layers=False, output_text_and_object_separately=True)
    packed, _ = model(*inputs, output_all_encoded_layers=False)
    assert text.shape == (3, 7, 32) and objects.shape == (3, 4, 32) and pooled.shape == (3, 32)
    assert torch.equal(objects[1], packed[1, 3:7])
    assert torch.equal(objects[0, :2], packed[0, 7:9]) and objects[0, 2:].abs().max() == 0
    assert torch.equal(text[1, :3], packed[1, :3])


def test_visual_scale_mode_without_layernorm():
    model = VisualLinguisticBert(vlbert_config(visual_ln=False, visual_scale_text_init=0.0)).eval()
    assert 'visual_scale_text' in dict(model.named_parameters()) and not hasattr(model, 'visual_ln_text')
    inputs = list(vl_inputs())
    base, _, _, _ = model.embedding(*inputs)
    inputs[2] = inputs[2] * 100  # text visual features are scaled by 0: no effect
    changed, _, _, _ = model.embedding(*inputs)
    assert torch.equal(base, changed)


def test_gradient_checkpointing_gives_same_outputs_and_gradients():
    torch.manual_seed(0)
    plain = VisualLinguisticBert(vlbert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).train()
    ckpt = VisualLinguisticBert(vlbert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                                gradient_checkpointing=True).train()
    ckpt.load_state_dict(plain.state_dict())
    grads = []
    for model in (plain, ckpt):
        out, pooled = model(*vl_inputs(), output_all_encoded_layers=False)
        (out.sum() + pooled.sum()).backward()
        grads.append(model.encoder.layer[0].intermediate.dense.weight.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_autocast_forward_backward_finite_with_padding_and_no_objects(dtype):
    model = VisualLinguisticBertForPretraining(vlbert_config()).train()
    inputs = vl_inputs()  # sample 2 has no RoIs, samples are padded
    with torch.autocast('cpu', dtype=dtype):
        relationship, mlm, mvrc = model(*inputs)
        loss = relationship.float().sum() + mlm.float().logsumexp(-1).mean() + mvrc.float().mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_pretraining_heads_and_tied_mlm_decoder():
    model = VisualLinguisticBertForPretraining(vlbert_config())
    assert model.mlm_head.predictions.decoder.weight is model.word_embeddings.weight
    relationship, mlm, mvrc = model.eval()(*vl_inputs())
    assert relationship.shape == (3, 2) and mlm.shape == (3, 7, 1200) and mvrc.shape == (3, 4, 1601)
    keys = model.state_dict().keys()
    assert {'relationsip_head.caption_image_relationship.weight', 'mlm_head.predictions.bias',
            'mlm_head.predictions.decoder.weight', 'mvrc_head.region_cls_pred.weight'} <= set(keys)


def test_word_embedding_frozen_keeps_trainable_special_words():
    model = VisualLinguisticBert(vlbert_config(word_embedding_frozen=True))
    assert not model.word_embeddings.weight.requires_grad
    assert torch.equal(model.special_word_embeddings.weight, model.word_embeddings.weight[:NUM_SPECIAL_WORDS])
    model.special_word_embeddings.weight.data.add_(1.0)
    ids = torch.tensor([[5, NUM_SPECIAL_WORDS + 3]])
    out = model.word_embedding(ids)
    assert torch.equal(out[0, 0], model.special_word_embeddings.weight[5])
    assert torch.equal(out[0, 1], model.word_embeddings.weight[NUM_SPECIAL_WORDS + 3])


def test_absolute_object_positions_are_rejected():
    with pytest.raises(ValueError, match='obj_pos_id_relative'):
        VisualLinguisticBert(vlbert_config(obj_pos_id_relative=False))


def test_time_distributed_folds_choices():
    model = VisualLinguisticBert(vlbert_config()).eval()
    wrapped = TimeDistributed(model)
    inputs = vl_inputs()
    choices = [torch.stack([x, x]) for x in inputs]  # [2, 3, ...]: two "questions" of three choices
    text, objects, pooled = wrapped(*choices, output_all_encoded_layers=False, output_text_and_object_separately=True)
    direct = model(*inputs, output_all_encoded_layers=False, output_text_and_object_separately=True)
    assert text.shape == (2, 3, 7, 32) and pooled.shape == (2, 3, 32)
    assert torch.allclose(pooled[1], direct[2], atol=1e-6) and torch.allclose(objects[0], direct[1], atol=1e-6)
    assert list(wrapped.state_dict())[0].startswith('_module.')
