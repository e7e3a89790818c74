"""BERT building blocks (Devlin et al., 2019) with the parameter names of ``pytorch_pretrained_bert``.

Module and parameter names (``attention.self.query``, ``output.LayerNorm`` ...) equal those of
``pytorch_pretrained_bert.modeling`` 0.6.2, the implementation the reference VL-BERT release used, so
its checkpoints load strictly. The computation differs: attention goes through
``torch.nn.functional.scaled_dot_product_attention`` (fused kernels), LayerNorm and GELU are the fused
PyTorch ops, the token-wise layers skip padded tokens (``Packing``), and encoder layers can be recomputed
in the backward pass (activation checkpointing).

All modules take a config object with BERT's attribute names (``hidden_size``, ``num_attention_heads``,
``intermediate_size``, ``hidden_act``, ``hidden_dropout_prob``, ``attention_probs_dropout_prob``,
``initializer_range``), e.g. the ``NETWORK.VLBERT`` node of a task config.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from common.modeling.module import exporting

# Additive bias for masked keys, as in BERT. exp(-10000) underflows to exactly 0 in fp32, fp16 and bf16, and
# the value is finite in fp16 (max 65504), so a row whose keys are all masked stays finite (uniform weights)
# instead of turning into NaN as a -inf mask would.
MASK_BIAS = -10000.0
LAYER_NORM_EPS = 1e-12

ACT2FN = {
    'gelu': F.gelu,  # exact (erf) GELU, the one BERT checkpoints were trained with
    'relu': F.relu,
    'swish': F.silu,
}


def activation(name):
    """Activation function for a BERT ``hidden_act`` name ('gelu', 'relu' or 'swish'); ValueError otherwise."""
    if name not in ACT2FN:
        raise ValueError("hidden_act must be one of {}, got '{}'".format(sorted(ACT2FN), name))
    return ACT2FN[name]


def attention_bias(mask, dtype=torch.float32):
    """Additive attention bias from a padding mask.

    Args:
        mask: [batch, keys] bool/int tensor, nonzero where a key may be attended.
        dtype: dtype of the returned bias.
    Returns:
        [batch, 1, 1, keys] tensor: 0 for valid keys, ``MASK_BIAS`` (-10000) for padded keys.
    """
    return (1.0 - mask[:, None, None, :].to(dtype)) * MASK_BIAS


def LayerNorm(hidden_size):
    """BERT's LayerNorm (epsilon 1e-12 inside the square root); parameters ``weight`` and ``bias``."""
    return nn.LayerNorm(hidden_size, eps=LAYER_NORM_EPS)


class Packing:
    """Positions of the valid (unpadded) tokens of a [B, L] batch.

    Layers other than attention treat tokens independently, so they run on the valid tokens only
    ([N, H], N = number of valid tokens) and skip the padding's compute; attention scatters them back to
    [B, L, H]. Padded keys carry ~0 attention weight, so their zero values change nothing.
    """

    def __init__(self, valid):
        self.batch, self.length = valid.shape
        self.index = valid.reshape(-1).nonzero().squeeze(1)


def pack(x, packing):
    """[B, L, H] -> [N, H] valid tokens (identity without packing)."""
    return x if packing is None else x.reshape(-1, x.shape[-1]).index_select(0, packing.index)


def unpack(x, packing):
    """[N, H] valid tokens -> [B, L, H] with zeros at padded positions (identity without packing)."""
    if packing is None:
        return x
    out = x.new_zeros((packing.batch * packing.length, x.shape[-1])).index_copy(0, packing.index, x)
    return out.view(packing.batch, packing.length, -1)


def init_bert_weights(module, initializer_range):
    """BERT initialisation for one module (use with ``Module.apply``).

    Linear and Embedding weights ~ N(0, initializer_range); Linear biases 0; LayerNorm weight 1, bias 0.
    """
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.data.normal_(mean=0.0, std=initializer_range)
    elif isinstance(module, nn.LayerNorm):
        module.weight.data.fill_(1.0)
        module.bias.data.zero_()
    if isinstance(module, nn.Linear) and module.bias is not None:
        module.bias.data.zero_()


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention.

    ``forward(hidden_states, bias [B, 1, 1, L] additive, output_attention_probs=False, packing=None)``
    returns ``(context, probs)``; hidden states and context are [B, L, H], or [N, H] valid tokens only when
    ``packing`` is given (see ``Packing``). ``probs`` is [B, heads, L, L] (after softmax, before dropout) on
    the eager path and None on the fused path.
    """

    def __init__(self, config):
        super().__init__()
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError("hidden_size ({}) must be a multiple of num_attention_heads ({})".format(
                config.hidden_size, config.num_attention_heads))
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def _heads(self, x):
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_attention_heads, self.attention_head_size).transpose(1, 2)

    def forward(self, hidden_states, bias, output_attention_probs=False, packing=None):
        q = self._heads(unpack(self.query(hidden_states), packing))
        k = self._heads(unpack(self.key(hidden_states), packing))
        v = self._heads(unpack(self.value(hidden_states), packing))
        bias = bias.to(q.dtype)
        dropout_p = self.dropout_p if self.training else 0.0
        probs = None
        if output_attention_probs:
            # Scale q before the product, as SDPA does: in fp16 the raw q.k overflows 65504 long
            # before the scaled scores do.
            scores = (q * (1.0 / math.sqrt(self.attention_head_size))) @ k.transpose(-1, -2) + bias
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout_p, self.training) @ v
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        batch, _, length, _ = context.shape
        return pack(context.transpose(1, 2).reshape(batch, length, -1), packing), probs


class BertResidualOutput(nn.Module):
    """Linear(in_features -> hidden), dropout, residual, LayerNorm: closes the attention block
    (in = hidden) and the feed-forward block (in = intermediate). Keys: dense, LayerNorm."""

    def __init__(self, config, in_features):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class BertAttention(nn.Module):
    """Self-attention followed by its output block; returns ``(hidden [B, L, H], probs or None)``."""

    def __init__(self, config):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertResidualOutput(config, config.hidden_size)

    def forward(self, hidden_states, bias, output_attention_probs=False, packing=None):
        context, probs = self.self(hidden_states, bias, output_attention_probs, packing)
        return self.output(context, hidden_states), probs


class BertIntermediate(nn.Module):
    """Feed-forward expansion: Linear(hidden -> intermediate) + activation."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, hidden_states):
        return self.act(self.dense(hidden_states))


class BertLayer(nn.Module):
    """One transformer layer; returns ``(hidden [B, L, H], attention probs or None)``."""

    def __init__(self, config):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertResidualOutput(config, config.intermediate_size)

    def forward(self, hidden_states, bias, output_attention_probs=False, packing=None):
        attention_output, probs = self.attention(hidden_states, bias, output_attention_probs, packing)
        return self.output(self.intermediate(attention_output), attention_output), probs


class BertEncoder(nn.Module):
    """Stack of ``num_hidden_layers`` BERT layers.

    Args:
        config: BERT-style config (see module docstring).
        gradient_checkpointing: recompute each layer in the backward pass instead of storing its
            activations (training only; saves memory at ~30% more compute).
    """

    def __init__(self, config, gradient_checkpointing=False):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])
        self.gradient_checkpointing = gradient_checkpointing

    def forward(self, hidden_states, attention_mask, output_all_encoded_layers=True, output_attention_probs=False):
        """Encode a sequence.

        Args:
            hidden_states: [B, L, H] float embeddings.
            attention_mask: [B, 1, 1, L] additive bias (see ``attention_bias``); 0 keeps a key, -10000 drops it.
            output_all_encoded_layers: return every layer's output, else only the last one.
            output_attention_probs: use the eager attention path and also return the per-layer
                attention probabilities ([B, heads, L, L] each).
        Returns:
            list of [B, L, H] tensors (all layers, or a one-element list), and, when
            ``output_attention_probs``, a list of attention probabilities per layer. With a key-padding
            mask the dense layers run on the valid tokens only and padded positions of the output are 0
            (BERT leaves meaningless values there).
        """
        encoded_layers, attention_probs = [], []
        packing = None
        valid = attention_mask[:, 0, 0, :] > MASK_BIAS / 2 if attention_mask.shape[2] == 1 else None
        if valid is not None and not exporting() and not bool(valid.all()):
            packing = Packing(valid)
            hidden_states = pack(hidden_states, packing)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layer:
            if recompute and not output_attention_probs:
                hidden_states, probs = checkpoint(layer, hidden_states, attention_mask, False, packing,
                                                  use_reentrant=False)
            else:
                hidden_states, probs = layer(hidden_states, attention_mask, output_attention_probs, packing)
            if output_all_encoded_layers:
                encoded_layers.append(unpack(hidden_states, packing))
            attention_probs.append(probs)
        if not output_all_encoded_layers:
            encoded_layers.append(unpack(hidden_states, packing))
        if output_attention_probs:
            return encoded_layers, attention_probs
        return encoded_layers


class BertPooler(nn.Module):
    """``tanh(Linear(h[:, 0]))``: sentence representation from the first token; [B, L, H] -> [B, H]."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states):
        return self.activation(self.dense(hidden_states[:, 0]))


class BertPredictionHeadTransform(nn.Module):
    """Linear + activation + LayerNorm applied before the MLM decoder; [..., H] -> [..., H]."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = activation(config.hidden_act)
        self.LayerNorm = LayerNorm(config.hidden_size)

    def forward(self, hidden_states):
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))
