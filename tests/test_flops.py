"""common.diagnostics.flops: the 6 N T + attention count, by hand and against torch's FLOP counter."""
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from common.diagnostics.flops import dense_weight_count, encoder_train_flops
from common.modeling.nlp.modeling import BertEncoder, attention_bias

TINY = SimpleNamespace(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
                       hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def test_hand_count_of_a_tiny_encoder():
    encoder = BertEncoder(TINY)
    # per layer: Q, K, V, attention output 8x8 each, feed-forward 8x16 and 16x8
    assert dense_weight_count(encoder) == 2 * (4 * 64 + 2 * 128) == 1024
    # two sequences of 5 and 3 tokens: 6 * 1024 * 8 + 12 * 2 layers * 8 hidden * (25 + 9)
    assert encoder_train_flops(1024, [5, 3], num_layers=2, hidden_size=8) == 49152 + 6528 == 55680
    assert encoder_train_flops(1024, [], 2, 8) == 0
    with pytest.raises(ValueError, match=">= 0"):
        encoder_train_flops(1024, [-1], 2, 8)


def test_count_equals_torch_flop_counter_on_a_forward_and_backward():
    # The eager attention path is made of matmuls torch's counter sees (SDPA on the CPU is not counted).
    torch.manual_seed(0)
    encoder = BertEncoder(TINY).train()
    batch, length = 3, 7
    hidden = torch.randn(batch, length, 8, requires_grad=True)
    bias = attention_bias(torch.ones(batch, length, dtype=torch.bool))
    with FlopCounterMode(display=False) as counter:
        out = encoder(hidden, bias, output_all_encoded_layers=False, output_attention_probs=True)[0][-1]
        out.pow(2).sum().backward()
    expected = encoder_train_flops(dense_weight_count(encoder), [length] * batch, 2, 8)
    assert counter.get_total_flops() == expected == 6 * 1024 * 21 + 12 * 2 * 8 * 49 * 3
