"""Optimizers from ``TRAIN.*``: the reference's LR scaling rule, LR_MULT param groups, SGD/Adam/AdamW."""
import math
from typing import List

import torch
from torch.distributed.tensor import DTensor

OPTIMIZERS = ("SGD", "Adam", "AdamW")
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Elements of bf16-stored moments given fp32 working copies at a time in a step (2 x 64 MiB of copies).
STATE_CHUNK_NUMEL = 1 << 24


def images_per_step(cfg, world_size: int) -> int:
    """Samples in one optimizer step over all ranks:
    ``BATCH_IMAGES`` (summed over data sets if a list) x world size x ``GRAD_ACCUMULATE_STEPS``."""
    per_rank = cfg.TRAIN.BATCH_IMAGES
    per_rank = sum(per_rank) if isinstance(per_rank, (list, tuple)) else per_rank
    return per_rank * world_size * cfg.TRAIN.GRAD_ACCUMULATE_STEPS


# Names (suffixes) of the learnable visual scales of VL-BERT: the scalar scales, or the visual LayerNorm
# gains that replace them with ``visual_ln`` (both start at ``visual_scale_*_init``).
VISUAL_SCALE_NAMES = {"text": ("visual_scale_text", "visual_ln_text.weight"),
                      "object": ("visual_scale_object", "visual_ln_object.weight")}


def visual_scale_groups(model: torch.nn.Module, train_config, base_lr: float) -> List[dict]:
    """Param groups of the learnable visual scales, from ``TRAIN.VISUAL_SCALE_{TEXT,OBJECT}_LR_MULT``
    (LR ``base_lr * mult``) and ``TRAIN.VISUAL_SCALE_CLIP_GRAD_NORM`` (> 0: the group's
    ``max_grad_norm``, its gradient norm limit before the global clip, see ``common.amp.LossScaler.step``).

    Empty at the defaults (mult 1, no clip), so the groups then equal the reference's, and for a task
    without these keys (they come with :func:`common.modeling.vlbert_config.add_visual_scale_config`).
    """
    if "VISUAL_SCALE_TEXT_LR_MULT" not in train_config:
        return []
    mults = {"text": train_config.VISUAL_SCALE_TEXT_LR_MULT, "object": train_config.VISUAL_SCALE_OBJECT_LR_MULT}
    clip = train_config.VISUAL_SCALE_CLIP_GRAD_NORM
    if all(m == 1.0 for m in mults.values()) and clip <= 0:
        return []
    groups = []
    for kind, suffixes in VISUAL_SCALE_NAMES.items():
        params = [p for name, p in model.named_parameters() if name.endswith(suffixes)]
        if params:
            group = {"params": params, "lr": base_lr * mults[kind]}
            if clip > 0:
                group["max_grad_norm"] = clip
            groups.append(group)
    return groups


def param_groups(model: torch.nn.Module, lr_mult, base_lr: float, first=()) -> List[dict]:
    """The groups ``first`` (their params are left out of the others), then one group per
    ``[name_substring, mult]`` of ``lr_mult`` (LR ``base_lr * mult``), in order, then one group
    (LR ``base_lr``) for every other parameter.

    Like the reference, groups hold all parameters, frozen ones included, so optimizer state
    dicts line up with the reference's. A parameter whose name holds several substrings goes to
    the first matching group (the reference would fail on the duplicate).

    Raises:
        ValueError: an entry that is not a ``[str, number]`` pair (``TRAIN.LR_MULT``).
    """
    for entry in lr_mult:
        if len(entry) != 2 or not isinstance(entry[0], str) or isinstance(entry[1], str):
            raise ValueError("TRAIN.LR_MULT entries must be [name_substring, multiplier], got {!r}".format(entry))
    taken = {id(p) for group in first for p in group["params"]}
    groups = [{"params": [], "lr": base_lr * float(mult)} for _, mult in lr_mult]
    rest = {"params": [], "lr": base_lr}
    for name, p in model.named_parameters():
        if id(p) in taken:
            continue
        index = next((i for i, (key, _) in enumerate(lr_mult) if key in name), None)
        (rest if index is None else groups[index])["params"].append(p)
    return list(first) + groups + [rest]


class BertAdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay, as in the BERT code the reference release trained with
    (pytorch-pretrained-bert / HuggingFace ``AdamW``, ``correct_bias=True``):

        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
        p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)     (bias correction on)
        p -= lr * wd * p                                                  (after the Adam update)

    ``torch.optim.AdamW`` is not the same update: it adds eps to the bias-corrected
    ``sqrt(v / (1 - b2^t))`` (an eps 1/sqrt(1 - b2^t) times smaller, 32x at t=1) and decays the
    weights before the Adam update. State keys (``step`` int, ``exp_avg``, ``exp_avg_sq``) equal
    the reference's, so its optimizer checkpoints load.

    ``state_dtype=torch.bfloat16`` stores ``exp_avg`` / ``exp_avg_sq`` in bf16 (half the state memory,
    the idea of optax's ``accumulator_dtype`` / ``mu_dtype``): each step reads them into fp32 working
    copies (:data:`STATE_CHUNK_NUMEL` elements at a time), runs the same fp32 update on the fp32
    weights and rounds the new moments back to bf16 (to nearest). The weights are never rounded, so
    an update far below a weight's bf16 spacing still moves it. ``torch.float32`` (the default) is the
    update above, unchanged.

    ``foreach=True`` updates all tensors of a group with a few multi-tensor kernels; ``foreach=False``
    runs the reference's loop of per-tensor ops (one parameter at a time, the decay as
    ``p += -lr * wd * p``). Both give the same update to ~1e-7 relative. ``foreach=None`` (the
    default) picks multi-tensor kernels for CUDA parameters and the loop otherwise: PyTorch has no
    multi-tensor CPU kernels, and there the loop is faster (0.60x for multi-tensor on BERT-base,
    ``bench/adamw_step.py``). The loop is also the reference-equivalent path of ``bench/throughput.py``.

    Raises:
        ValueError: negative lr/eps, betas outside [0, 1), a state dtype other than fp32 / bf16.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, correct_bias=True,
                 foreach=None, state_dtype=torch.float32):
        if lr < 0.0 or eps < 0.0 or not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError("AdamW: need lr >= 0, eps >= 0, 0 <= betas < 1; got lr={}, eps={}, betas={}"
                             .format(lr, eps, betas))
        if state_dtype not in STATE_DTYPES.values():
            raise ValueError("TRAIN.OPTIM_STATE_DTYPE: expected torch.float32 or torch.bfloat16, got {}".format(state_dtype))
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      correct_bias=correct_bias))
        self.foreach = foreach
        self.state_dtype = state_dtype

    def load_state_dict(self, state_dict):
        """As ``torch.optim.Optimizer.load_state_dict``, which casts the loaded moments to the
        parameters' dtype (fp32); they go back to ``state_dtype`` (bf16 -> fp32 -> bf16 is exact, so a
        bf16 checkpoint resumes bit for bit; an fp32 checkpoint loaded into bf16 state is rounded once)."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(self.state_dtype)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, step_sizes = [], [], [], [], []
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.state_dtype, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self.state_dtype,
                                                           memory_format=torch.preserve_format)
                state["step"] += 1
                step_size = group["lr"]
                if group["correct_bias"]:
                    step_size *= math.sqrt(1.0 - beta2 ** state["step"]) / (1.0 - beta1 ** state["step"])
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                step_sizes.append(-step_size)
            if not params:
                continue
            update = _foreach_update if (params[0].is_cuda if self.foreach is None else self.foreach) else _plain_update
            if exp_avgs[0].dtype == torch.float32:
                update(params, grads, exp_avgs, exp_avg_sqs, step_sizes, group)
                continue
            for chunk in _chunks(params, STATE_CHUNK_NUMEL):
                work_avgs = [exp_avgs[i].float() for i in chunk]
                work_sqs = [exp_avg_sqs[i].float() for i in chunk]
                update([params[i] for i in chunk], [grads[i] for i in chunk], work_avgs, work_sqs,
                       [step_sizes[i] for i in chunk], group)
                _copy_into([exp_avgs[i] for i in chunk], work_avgs)
                _copy_into([exp_avg_sqs[i] for i in chunk], work_sqs)
        return loss


def _copy_into(dst, src):
    """``dst[i].copy_(src[i])`` for every i: one multi-tensor copy, or one copy a tensor for DTensors (FSDP
    shards), for which ``_foreach_copy_`` has no sharding rule."""
    if isinstance(dst[0], DTensor):
        for d, s in zip(dst, src):
            d.copy_(s)
    else:
        torch._foreach_copy_(dst, src)


def _chunks(tensors, max_numel):
    """Index lists splitting ``tensors`` in order into runs of at most ``max_numel`` elements
    (a tensor larger than that is a run of its own)."""
    chunk, numel = [], 0
    for i, t in enumerate(tensors):
        if chunk and numel + t.numel() > max_numel:
            yield chunk
            chunk, numel = [], 0
        chunk.append(i)
        numel += t.numel()
    if chunk:
        yield chunk


def _foreach_update(params, grads, exp_avgs, exp_avg_sqs, step_sizes, group):
    """BertAdamW's update of a group with multi-tensor kernels (``foreach=True``)."""
    beta1, beta2 = group["betas"]
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denom, group["eps"])
    torch._foreach_addcdiv_(params, exp_avgs, denom, step_sizes)
    if group["weight_decay"] > 0.0:
        torch._foreach_mul_(params, 1.0 - group["lr"] * group["weight_decay"])


def _plain_update(params, grads, exp_avgs, exp_avg_sqs, step_sizes, group):
    """BertAdamW's update one tensor at a time, in the reference's order of ops (``foreach=False``)."""
    beta1, beta2 = group["betas"]
    for p, g, m, v, step_size in zip(params, grads, exp_avgs, exp_avg_sqs, step_sizes):
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        p.addcdiv_(m, v.sqrt().add_(group["eps"]), value=step_size)
        if group["weight_decay"] > 0.0:
            p.add_(p, alpha=-group["lr"] * group["weight_decay"])


def build_optimizer(cfg, model: torch.nn.Module, world_size: int = 1) -> torch.optim.Optimizer:
    """The reference's optimizer for ``cfg.TRAIN``.

    Base LR = ``TRAIN.LR x images_per_step(cfg, world_size)``; visual-scale groups
    (:func:`visual_scale_groups`), then ``TRAIN.LR_MULT`` groups;
    ``SGD`` (MOMENTUM, WD), ``Adam`` (WD as L2, torch defaults otherwise) or ``AdamW``
    (:class:`BertAdamW`: betas (0.9, 0.999), eps 1e-6, WD, bias correction, moments stored in
    ``TRAIN.OPTIM_STATE_DTYPE``).

    Args:
        model: the model (DDP-wrapped or not: names are matched by substring).
        world_size: number of training processes.

    Raises:
        ValueError: unknown ``TRAIN.OPTIMIZER`` or ``TRAIN.OPTIM_STATE_DTYPE``, bad ``TRAIN.LR_MULT``,
            ``OPTIM_STATE_DTYPE`` 'bfloat16' with an optimizer other than AdamW.
    """
    train = cfg.TRAIN
    if train.OPTIM_STATE_DTYPE not in STATE_DTYPES:
        raise ValueError("TRAIN.OPTIM_STATE_DTYPE: expected one of {}, got {!r}".format(
            ", ".join(STATE_DTYPES), train.OPTIM_STATE_DTYPE))
    if train.OPTIM_STATE_DTYPE != "float32" and train.OPTIMIZER != "AdamW":
        raise ValueError("TRAIN.OPTIM_STATE_DTYPE {!r} is implemented for TRAIN.OPTIMIZER 'AdamW' only, got {!r}"
                         .format(train.OPTIM_STATE_DTYPE, train.OPTIMIZER))
    base_lr = train.LR * images_per_step(cfg, world_size)
    groups = param_groups(model, train.LR_MULT, base_lr, first=visual_scale_groups(model, train, base_lr))
    if train.OPTIMIZER == "SGD":
        return torch.optim.SGD(groups, lr=base_lr, momentum=train.MOMENTUM, weight_decay=train.WD)
    if train.OPTIMIZER == "Adam":
        return torch.optim.Adam(groups, lr=base_lr, weight_decay=train.WD)
    if train.OPTIMIZER == "AdamW":
        return BertAdamW(groups, lr=base_lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=train.WD, correct_bias=True,
                         state_dtype=STATE_DTYPES[train.OPTIM_STATE_DTYPE])
    raise ValueError("TRAIN.OPTIMIZER: expected one of {}, got {!r}".format(OPTIMIZERS, train.OPTIMIZER))
