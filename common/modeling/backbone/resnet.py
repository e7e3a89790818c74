"""ResNet trunks for the Fast R-CNN image encoder, built from torchvision's ResNet.

The trunk is split the way Fast R-CNN with a C4 backbone uses it (He et al., "Deep Residual
Learning for Image Recognition", CVPR 2016, Sec. 4.3 / Appendix A): the stem and stages
res2..res4 run once per image (output stride 16), and res5 runs once per RoI as the box head.

Two options of the Caffe models VL-BERT starts from (bottom-up-attention ResNet-101) that
torchvision lacks are applied to torchvision's own blocks after construction:

* ``stride_in_1x1``: a stage's down-sampling stride sits in the first 1x1 conv of its first
  bottleneck (MSRA / Caffe style) instead of in the 3x3 conv (torchvision, "ResNet v1.5").
* ``c5_dilated``: res5 keeps stride 1 and all its 3x3 convs use dilation 2 (so a 14x14 RoI
  stays 14x14), as in the reference release, whose first res5 block is also dilated.

State-dict keys equal torchvision's (``conv1``, ``bn1``, ``layer1``.. ``layer3`` for the trunk;
``0.conv1``.. for res5), which are also the reference release's keys.
"""
import torch
from torch import nn
from torchvision.models import resnet as tv_resnet

__all__ = ["FrozenBatchNorm2d", "ResNetC4", "build_resnet", "convert_frozen_batchnorm", "freeze_stages",
           "load_resnet_weights", "resnet_channels", "RESNET_DEPTHS"]

# depth -> (block class, number of blocks in res2..res5); torchvision's table.
_SPECS = {
    18: (tv_resnet.BasicBlock, (2, 2, 2, 2)),
    34: (tv_resnet.BasicBlock, (3, 4, 6, 3)),
    50: (tv_resnet.Bottleneck, (3, 4, 6, 3)),
    101: (tv_resnet.Bottleneck, (3, 4, 23, 3)),
    152: (tv_resnet.Bottleneck, (3, 8, 36, 3)),
}
RESNET_DEPTHS = tuple(_SPECS)


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d with fixed statistics and affine parameters: ``y = (x - mean) / sqrt(var + eps) * w + b``.

    Unlike ``nn.BatchNorm2d`` in eval mode it cannot be switched back to batch statistics by
    ``model.train()``, and unlike ``torchvision.ops.FrozenBatchNorm2d`` its state dict keeps
    ``num_batches_tracked`` and ``weight``/``bias`` are (frozen) parameters, so keys and the
    parameter count equal those of the reference release's ``nn.BatchNorm2d``.

    The per-channel scale and shift are computed in float32 whatever the dtype of the stored
    tensors, then cast to the input's dtype: a tiny or zero ``running_var`` stays finite in
    float16 / bfloat16 (``eps`` = 1e-5 as in ``nn.BatchNorm2d``, which the reference used).

    Input and output: ``[N, C, H, W]``, any floating dtype.
    """

    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_features), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(num_features), requires_grad=False)
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x):
        scale = self.weight.float() * torch.rsqrt(self.running_var.float() + self.eps)
        shift = self.bias.float() - self.running_mean.float() * scale
        return x * scale.to(x.dtype).view(1, -1, 1, 1) + shift.to(x.dtype).view(1, -1, 1, 1)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Converted Caffe weights and torchvision checkpoints older than 0.4 have no counter.
        state_dict.setdefault(prefix + "num_batches_tracked", torch.tensor(0, dtype=torch.long))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    @classmethod
    def from_batchnorm(cls, bn):
        """A frozen copy of ``bn`` (an ``nn.BatchNorm2d``), with its statistics and affine parameters."""
        frozen = cls(bn.num_features, bn.eps)
        with torch.no_grad():
            if bn.affine:
                frozen.weight.copy_(bn.weight)
                frozen.bias.copy_(bn.bias)
            if bn.track_running_stats:
                frozen.running_mean.copy_(bn.running_mean)
                frozen.running_var.copy_(bn.running_var)
                frozen.num_batches_tracked.copy_(bn.num_batches_tracked)
        return frozen

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}"


def convert_frozen_batchnorm(module):
    """Replace every ``nn.BatchNorm2d`` inside ``module`` by a :class:`FrozenBatchNorm2d` copy.

    Returns the converted module (``module`` itself unless it is a BatchNorm2d).
    """
    if isinstance(module, nn.BatchNorm2d):
        return FrozenBatchNorm2d.from_batchnorm(module)
    for name, child in module.named_children():
        converted = convert_frozen_batchnorm(child)
        if converted is not child:
            setattr(module, name, converted)
    return module


class ResNetC4(nn.Module):
    """Stem and stages res2..res4 of a torchvision ResNet: images -> C4 features at stride 16.

    Takes the submodules of ``net`` (a ``torchvision.models.ResNet``) so that parameter names
    stay ``conv1``, ``bn1``, ``layer1``.. ``layer3``.

    ``forward(images)``: ``[B, 3, H, W]`` -> ``[B, C4, ceil(H / 16), ceil(W / 16)]``
    (C4 = 256 for ResNet-18/34, 1024 for ResNet-50/101/152).
    """

    def __init__(self, net):
        super().__init__()
        self.conv1, self.bn1, self.relu, self.maxpool = net.conv1, net.bn1, net.relu, net.maxpool
        self.layer1, self.layer2, self.layer3 = net.layer1, net.layer2, net.layer3

    def forward(self, images):
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        return self.layer3(self.layer2(self.layer1(x)))


def resnet_channels(depth):
    """Output channels ``(C4, C5)`` of res4 and res5 for a ResNet ``depth`` in :data:`RESNET_DEPTHS`."""
    block, _ = _spec(depth)
    return 256 * block.expansion, 512 * block.expansion


def _spec(depth):
    if depth not in _SPECS:
        raise ValueError(f"NETWORK.IMAGE_NUM_LAYERS must be one of {RESNET_DEPTHS}, got {depth!r}")
    return _SPECS[depth]


def _set_conv(conv, stride=None, dilation=None):
    # nn.Conv2d reads these attributes at every call, so changing them after construction is safe.
    if stride is not None:
        conv.stride = (stride, stride)
    if dilation is not None:
        conv.dilation = (dilation, dilation)
        conv.padding = (dilation * (conv.kernel_size[0] // 2), dilation * (conv.kernel_size[1] // 2))


def _move_stride_to_1x1(stage):
    first = stage[0]
    if isinstance(first, tv_resnet.Bottleneck) and first.conv2.stride != (1, 1):
        _set_conv(first.conv1, stride=first.conv2.stride[0])
        _set_conv(first.conv2, stride=1)


def _dilate(stage, dilation):
    first = stage[0]
    strided = [first.conv1, first.conv2] + ([first.downsample[0]] if first.downsample is not None else [])
    for conv in strided:
        _set_conv(conv, stride=1)
    for block in stage:
        for conv in block.modules():
            if isinstance(conv, nn.Conv2d) and conv.kernel_size == (3, 3):
                _set_conv(conv, dilation=dilation)


def build_resnet(depth, stride_in_1x1=False, c5_dilated=False, frozen_bn=True):
    """Build a ResNet from torchvision's blocks, split into a C4 trunk and a res5 stage.

    Args:
        depth: 18, 34, 50, 101 or 152 (``NETWORK.IMAGE_NUM_LAYERS``).
        stride_in_1x1: put each stage's stride 2 in the first 1x1 conv (bottleneck ResNets only;
            ResNet-18/34 have no 1x1 conv and ignore it). ``NETWORK.IMAGE_STRIDE_IN_1x1``.
        c5_dilated: res5 with stride 1 and dilation 2 (``NETWORK.IMAGE_C5_DILATED``).
        frozen_bn: use :class:`FrozenBatchNorm2d` instead of ``nn.BatchNorm2d``
            (``NETWORK.IMAGE_FROZEN_BN``).

    Returns:
        ``(trunk, res5)``: a :class:`ResNetC4` and the res5 ``nn.Sequential`` (input C4 channels,
        output C5 channels, stride 2 or 1 when dilated). Weights are torchvision's random init
        (Kaiming normal convs, BN weight 1 / bias 0).

    Raises:
        ValueError: ``depth`` is not a supported ResNet depth.
    """
    block, layers = _spec(depth)
    norm_layer = FrozenBatchNorm2d if frozen_bn else nn.BatchNorm2d
    # torchvision initialises only nn.BatchNorm2d; FrozenBatchNorm2d starts as the identity anyway.
    net = tv_resnet.ResNet(block, list(layers), num_classes=1, norm_layer=norm_layer)
    if stride_in_1x1:
        for stage in (net.layer2, net.layer3, net.layer4):
            _move_stride_to_1x1(stage)
    if c5_dilated:
        _dilate(net.layer4, 2)
    return ResNetC4(net), net.layer4


def freeze_stages(trunk, res5, stages):
    """Stop training the given stages: parameters get ``requires_grad=False``, BN becomes frozen.

    Stage numbers follow the reference release: 1 = stem (``conv1``, ``bn1``), 2..4 = ``layer1``..
    ``layer3`` of ``trunk``, 5 = ``res5``. Their BatchNorm layers are converted to
    :class:`FrozenBatchNorm2d` so that train mode cannot update their statistics either.

    Raises:
        ValueError: a stage outside 1..5 (``NETWORK.IMAGE_FROZEN_BACKBONE_STAGES``).
    """
    modules = {1: ("conv1", "bn1"), 2: ("layer1",), 3: ("layer2",), 4: ("layer3",)}
    for stage in stages:
        if stage == 5:
            targets = [(None, res5)]
        elif stage in modules:
            targets = [(name, getattr(trunk, name)) for name in modules[stage]]
        else:
            raise ValueError(f"NETWORK.IMAGE_FROZEN_BACKBONE_STAGES entries must be in 1..5, got {stage!r}")
        for name, module in targets:
            module = convert_frozen_batchnorm(module)
            if name is not None:
                setattr(trunk, name, module)
            for param in module.parameters():
                param.requires_grad_(False)


def load_resnet_weights(trunk, res5, state_dict, source):
    """Copy a whole-ResNet state dict (torchvision / reference key layout) into ``trunk`` and ``res5``.

    Keys ``conv1.*``, ``bn1.*``, ``layer1.*``.. ``layer3.*`` go to the trunk and ``layer4.*`` to res5
    (the reference release's pretrained ``resnet101-pt-vgbua-0000.model`` and torchvision's ImageNet
    files use this layout). Other keys (``fc.*``) are ignored; a missing ``num_batches_tracked`` is
    filled in.

    Raises:
        ValueError: a weight of the trunk or res5 is absent from ``state_dict``; the message names
            ``source`` (the file) and the missing keys.
        RuntimeError: a tensor has the wrong shape (from ``load_state_dict``).
    """
    prefix = "layer4."
    res5_state = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    trunk_state = {k: v for k, v in state_dict.items() if not k.startswith(prefix)}
    missing = [f"layer4.{k}" for k in res5.load_state_dict(res5_state, strict=False).missing_keys]
    missing += trunk.load_state_dict(trunk_state, strict=False).missing_keys
    # nn.BatchNorm2d (unlike FrozenBatchNorm2d) reports an absent counter; it is not a weight.
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    if missing:
        shown = ", ".join(missing[:8]) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
        raise ValueError(f"{source}: not a ResNet state dict for this depth; missing {shown}")
