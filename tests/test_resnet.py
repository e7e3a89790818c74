"""ResNet trunk / res5 built on torchvision: Caffe-style stride, dilated C5, frozen BN and stages."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import resnet as tv_resnet

from common.modeling.backbone import (FrozenBatchNorm2d, build_resnet, convert_frozen_batchnorm, freeze_stages,
                             load_resnet_weights, resnet_channels)

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)  # torchvision's weight init draws from the global generator


def _random_stats(module, generator):
    """Give every (frozen) BN non-trivial statistics and affine parameters."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.BatchNorm2d, FrozenBatchNorm2d)):
                n = m.num_features
                m.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                m.bias.copy_(torch.randn(n, generator=generator) * 0.1)
                m.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=generator) + 0.5)


@pytest.mark.parametrize("stride_in_1x1", [True, False])
def test_stride_position(stride_in_1x1):
    trunk, res5 = build_resnet(50, stride_in_1x1=stride_in_1x1)
    for stage in (trunk.layer2, trunk.layer3, res5):
        first = stage[0]
        assert first.conv1.stride == ((2, 2) if stride_in_1x1 else (1, 1))
        assert first.conv2.stride == ((1, 1) if stride_in_1x1 else (2, 2))
        assert first.downsample[0].stride == (2, 2)
        assert all(b.conv1.stride == b.conv2.stride == (1, 1) for b in stage[1:])
    # res2 never strides (the max-pool does).
    assert trunk.layer1[0].conv1.stride == trunk.layer1[0].conv2.stride == (1, 1)


def test_stride_in_1x1_block_value():
    """With the stride in the 1x1 conv, the block equals: subsample by 2, then stride-1 convs."""
    g = torch.Generator().manual_seed(0)
    trunk, _ = build_resnet(50, stride_in_1x1=True)
    block = trunk.layer2[0]
    _random_stats(block, g)
    x = torch.randn(2, 256, 9, 11, generator=g)

    def bn(m, y):
        return F.batch_norm(y, m.running_mean, m.running_var, m.weight, m.bias, False, 0.0, m.eps)

    sub = x[:, :, ::2, ::2]
    y = F.relu(bn(block.bn1, F.conv2d(sub, block.conv1.weight)))
    y = F.relu(bn(block.bn2, F.conv2d(y, block.conv2.weight, padding=1)))
    y = bn(block.bn3, F.conv2d(y, block.conv3.weight))
    expected = F.relu(y + bn(block.downsample[1], F.conv2d(sub, block.downsample[0].weight)))
    with torch.no_grad():
        out = block(x)
    assert out.shape == (2, 512, 5, 6)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("depth", [18, 50])
def test_c4_stride_and_channels(depth):
    trunk, _ = build_resnet(depth)
    with torch.no_grad():
        c4 = trunk(torch.randn(1, 3, 70, 100))
    assert c4.shape == (1, resnet_channels(depth)[0], 5, 7)  # ceil(70 / 16), ceil(100 / 16)


@pytest.mark.parametrize("depth", [18, 50])
def test_dilated_c5(depth):
    c4_channels, c5_channels = resnet_channels(depth)
    x = torch.randn(2, c4_channels, 14, 14)
    _, plain = build_resnet(depth, c5_dilated=False)
    _, dilated = build_resnet(depth, stride_in_1x1=True, c5_dilated=True)
    with torch.no_grad():
        assert plain(x).shape == (2, c5_channels, 7, 7)
        assert dilated(x).shape == (2, c5_channels, 14, 14)
    convs3x3 = [m for m in dilated.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    assert convs3x3 and all(c.dilation == (2, 2) and c.padding == (2, 2) for c in convs3x3)
    assert all(m.stride == (1, 1) for m in dilated.modules() if isinstance(m, nn.Conv2d))


def test_keys_and_shapes_equal_torchvision():
    """Trunk + res5 hold exactly torchvision's ResNet-50 tensors, so its files load unchanged."""
    trunk, res5 = build_resnet(50, stride_in_1x1=True, c5_dilated=True)
    ours = {k: v.shape for k, v in trunk.state_dict().items()}
    ours.update({f"layer4.{k}": v.shape for k, v in res5.state_dict().items()})
    reference = {k: v.shape for k, v in tv_resnet.resnet50().state_dict().items() if not k.startswith("fc.")}
    assert ours == reference


def test_frozen_bn_is_affine_and_stays_frozen_in_train_mode():
    g = torch.Generator().manual_seed(1)
    bn = FrozenBatchNorm2d(8)
    _random_stats(bn, g)
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    x = torch.randn(4, 8, 5, 5, generator=g) * 3 + 1
    bn.train()
    out = bn(x)
    scale = bn.weight / torch.sqrt(bn.running_var + 1e-5)
    expected = (x - bn.running_mean[:, None, None]) * scale[:, None, None] + bn.bias[:, None, None]
    torch.testing.assert_close(out, expected)
    for k, v in bn.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert sorted(bn.state_dict()) == ["bias", "num_batches_tracked", "running_mean", "running_var", "weight"]
    assert sum(p.numel() for p in bn.parameters()) == 16 and not any(p.requires_grad for p in bn.parameters())


def test_frozen_bn_loads_state_without_counter():
    src = nn.BatchNorm2d(4)
    state = {k: torch.rand_like(v.float()) for k, v in src.state_dict().items() if k != "num_batches_tracked"}
    bn = FrozenBatchNorm2d(4)
    bn.load_state_dict(state)
    torch.testing.assert_close(bn.running_var, state["running_var"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_frozen_bn_low_precision_tiny_var(dtype):
    """Zero / 1e-12 variance: scale and shift are computed in float32, so half precision stays finite."""
    bn = FrozenBatchNorm2d(3)
    with torch.no_grad():
        bn.running_var.copy_(torch.tensor([0.0, 1e-12, 1e-8]))
        bn.weight.fill_(3e-3)
        bn.running_mean.fill_(0.2)
    x = torch.randn(2, 3, 4, 4)
    expected = bn(x)
    out = bn.to(dtype)(x.to(dtype))
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


def test_convert_frozen_batchnorm_keeps_eval_output():
    g = torch.Generator().manual_seed(2)
    trunk, _ = build_resnet(18, frozen_bn=False)
    _random_stats(trunk, g)
    x = torch.randn(1, 3, 48, 48, generator=g)
    with torch.no_grad():
        expected = trunk.eval()(x)
        frozen = convert_frozen_batchnorm(trunk).train()
        out = frozen(x)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in frozen.modules())
    # Same maths, different rounding (fused batch_norm vs scale-and-shift): |out| is ~20 here.
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)


def test_frozen_stages_do_not_change():
    """Stages 1 and 2 (stem, res2) keep their weights and BN statistics through a training step."""
    trunk, res5 = build_resnet(18, frozen_bn=False)
    freeze_stages(trunk, res5, [1, 2])
    assert isinstance(trunk.bn1, FrozenBatchNorm2d) and isinstance(trunk.layer1[0].bn1, FrozenBatchNorm2d)
    assert isinstance(trunk.layer2[0].bn1, nn.BatchNorm2d)
    frozen = [trunk.conv1, trunk.bn1, trunk.layer1]
    assert not any(p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.requires_grad for p in trunk.layer2.parameters())

    before = {k: v.clone() for k, v in trunk.state_dict().items()}
    trainable = [p for p in trunk.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.1, momentum=0.9)
    trunk.train()
    trunk(torch.randn(2, 3, 48, 48)).square().mean().backward()
    optimizer.step()
    after = trunk.state_dict()
    for k in before:
        # Everything else moves: weights by the step, BN statistics by the train-mode forward.
        assert torch.equal(before[k], after[k]) == k.startswith(("conv1.", "bn1.", "layer1.")), k


def test_freeze_stage5_and_bad_stage():
    trunk, res5 = build_resnet(18, frozen_bn=False)
    freeze_stages(trunk, res5, [5])
    assert not any(p.requires_grad for p in res5.parameters())
    assert all(p.requires_grad for p in trunk.layer3.parameters())
    with pytest.raises(ValueError, match="IMAGE_FROZEN_BACKBONE_STAGES"):
        freeze_stages(trunk, res5, [6])


def test_bad_depth():
    with pytest.raises(ValueError, match="IMAGE_NUM_LAYERS"):
        build_resnet(42)


def test_load_resnet_weights_round_trip():
    source = tv_resnet.resnet18()
    g = torch.Generator().manual_seed(3)
    state = {k: (torch.randn(v.shape, generator=g) if v.is_floating_point() else v)
             for k, v in source.state_dict().items() if not k.endswith("num_batches_tracked")}
    trunk, res5 = build_resnet(18)
    load_resnet_weights(trunk, res5, state, "mem")
    for k, v in trunk.state_dict().items():
        if not k.endswith("num_batches_tracked"):
            assert torch.equal(v, state[k]), k
    for k, v in res5.state_dict().items():
        if not k.endswith("num_batches_tracked"):
            assert torch.equal(v, state["layer4." + k]), k

    del state["layer3.1.conv2.weight"]
    with pytest.raises(ValueError, match=r"some\.model: .*layer3\.1\.conv2\.weight"):
        load_resnet_weights(trunk, res5, state, "some.model")
