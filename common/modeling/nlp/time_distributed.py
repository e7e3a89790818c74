"""Apply a module to inputs with an extra leading dimension (e.g. VCR's 4 answer choices per question)."""
import torch
import torch.nn as nn


class TimeDistributed(nn.Module):
    """Fold the first two dimensions of every tensor input into one, run the module, unfold its outputs.

    The wrapped module is stored as ``_module`` so that checkpoint keys read ``vlbert._module.*`` as in
    the reference release. Inputs are [B, T, ...]; the module sees [B*T, ...]; every output tensor is
    returned as [B, T, ...] (nested lists/tuples are unfolded element-wise, None passes through).
    """

    def __init__(self, module):
        super().__init__()
        self._module = module

    def forward(self, *inputs, **kwargs):
        leading = None
        folded = []
        for x in inputs:
            if x.dim() < 3:
                raise ValueError("TimeDistributed needs inputs with at least 3 dimensions, got {}".format(
                    tuple(x.shape)))
            leading = x.shape[:2]
            folded.append(x.reshape(-1, *x.shape[2:]))
        return self._unfold(self._module(*folded, **kwargs), leading)

    def _unfold(self, output, leading):
        if output is None:
            return None
        if isinstance(output, torch.Tensor):
            return output.reshape(*leading, *output.shape[1:])
        if isinstance(output, (list, tuple)):
            return type(output)(self._unfold(o, leading) for o in output)
        raise TypeError("TimeDistributed cannot unfold an output of type {}".format(type(output).__name__))
