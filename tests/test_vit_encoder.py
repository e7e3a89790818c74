"""ViT image encoder (NETWORK.IMAGE_ENCODER 'vit'): shapes and dtypes, RoI features by hand, each image at its own
size, frozen blocks, fp32 attention under autocast, gradient checkpointing, timm weights, the config keys of
each encoder, and the image encoder a checkpoint records."""
import pytest
import timm
import torch
import yaml
from torchvision.ops import roi_align

from common.config import ConfigError
from common.errors import UserInputError
from common.modeling.fast_rcnn import FastRCNN
from common.modeling.image_encoder import build_image_encoder, check_checkpoint_encoder, checkpoint_image_encoder
from common.modeling.vit_encoder import ViTEncoder
from tests.cpu_kernels import CPU_BF16_SDPA_BUG, cpu_bf16_sdpa_broken
from vcr.task import TASK as VCR_TASK

torch.set_num_threads(1)

ARCH = "vit_tiny_patch16_224"
KWARGS = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2)
PATCH = KWARGS["patch_size"]


def vit_config(**network):
    """VCR defaults with the tiny ViT encoder (no class embedding) and ``network`` overrides."""
    values = dict(IMAGE_ENCODER="vit", IMAGE_VIT_ARCH=ARCH, IMAGE_VIT_ARCH_KWARGS=[list(kv) for kv in KWARGS.items()],
                  IMAGE_SEMANTIC=False, IMAGE_PRETRAINED="", IMAGE_ROI_POOLED_SIZE=4)
    values.update(network)
    opts = []
    for key, value in values.items():
        opts += ["NETWORK." + key, value if isinstance(value, str) else repr(value)]
    return VCR_TASK.load_config(None, opts)


def make_encoder(final_dim=16, enable_cnn_reg_loss=False, **network):
    torch.manual_seed(0)
    return build_image_encoder(vit_config(**network), final_dim=final_dim,
                               enable_cnn_reg_loss=enable_cnn_reg_loss).eval()


def batch():
    """Two images on a 64 x 96 canvas: 96 x 64 and 40 x 30 (the rest zero), 3 box slots each; box 1 of image 0
    is its whole image (the ADD_IMAGE_AS_A_BOX box)."""
    g = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 64, 96, generator=g)
    images[1, :, 30:] = 0
    images[1, :, :, 40:] = 0
    boxes = torch.tensor([[[4.0, 6.0, 50.0, 40.0], [0.0, 0.0, 95.0, 63.0], [20.0, 2.0, 90.0, 60.0]],
                          [[3.0, 5.0, 30.0, 25.0], [-2.0, -2.0, -2.0, -2.0], [-2.0, -2.0, -2.0, -2.0]]])
    box_mask = torch.tensor([[True, True, True], [True, False, False]])
    im_info = torch.tensor([[96.0, 64.0, 1.0, 1.0], [40.0, 30.0, 1.0, 1.0]])
    return images, boxes, box_mask, im_info


def test_factory_builds_the_encoder_the_config_names():
    assert isinstance(make_encoder(), ViTEncoder)
    resnet = VCR_TASK.load_config(None, ["NETWORK.IMAGE_NUM_LAYERS", "18", "NETWORK.IMAGE_PRETRAINED", ""])
    assert isinstance(build_image_encoder(resnet, final_dim=8), FastRCNN)


def test_output_shapes_and_dtypes_fp32():
    encoder = make_encoder(enable_cnn_reg_loss=True)
    images, boxes, box_mask, im_info = batch()
    classes = torch.tensor([[1, 2, 3], [4, 0, 0]])
    out = encoder(images, boxes, box_mask, im_info, classes=classes)
    assert out["obj_reps_raw"].shape == (2, 3, 24) and out["obj_reps_raw"].dtype == torch.float32
    assert out["obj_reps"].shape == (2, 3, 16) and out["obj_reps"].dtype == torch.float32
    assert out["obj_logits"].shape == (4, 81) and out["obj_labels"].tolist() == [1, 2, 3, 4]
    assert out["cnn_regularization_loss"].shape == (1,)
    assert not out["obj_reps_raw"][1, 1:].any() and not out["obj_reps"][1, 1:].any()  # padded slots
    assert encoder.feat_dim == 24


@pytest.mark.skipif(cpu_bf16_sdpa_broken(), reason=CPU_BF16_SDPA_BUG)
def test_output_dtypes_under_bf16_autocast():
    encoder = make_encoder(enable_cnn_reg_loss=True)
    images, boxes, box_mask, im_info = batch()
    classes = torch.tensor([[1, 2, 3], [4, 0, 0]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = encoder(images, boxes, box_mask, im_info, classes=classes)
    assert mixed["obj_reps_raw"].dtype == torch.float32  # the ViT's final LayerNorm runs in fp32
    assert mixed["obj_reps"].dtype == torch.bfloat16 and torch.isfinite(mixed["obj_reps"].float()).all()


def by_hand(encoder, image, box, whole_image):
    """The feature of ``box`` in ``image`` ([3, h, w], its own size): timm's tokens, the patch tokens reshaped to
    their grid, torchvision's RoI Align at stride 8 (ViTDet's settings), the crop's mean; the CLS token or the
    patch mean for a whole-image box."""
    tokens = encoder.vit.forward_features(image[None])
    grid_h, grid_w = -(-image.shape[1] // PATCH), -(-image.shape[2] // PATCH)
    patches = tokens[0, 1:]
    assert patches.shape[0] == grid_h * grid_w
    if whole_image:
        return tokens[0, 0] if encoder.whole_image == "cls" else patches.mean(0)
    fmap = patches.T.reshape(1, -1, grid_h, grid_w)
    crop = roi_align(fmap, torch.tensor([[0.0, *box]]), (4, 4), spatial_scale=1 / PATCH, sampling_ratio=0,
                     aligned=True)
    return crop.mean((0, 2, 3))


@pytest.mark.parametrize("whole_image", ["cls", "mean"])
def test_roi_features_equal_roi_align_over_the_patch_grid_and_the_whole_image_token(whole_image):
    encoder = make_encoder(IMAGE_VIT_WHOLE_IMAGE=whole_image)
    images, boxes, box_mask, im_info = batch()
    with torch.no_grad():
        raw = encoder(images, boxes, box_mask, im_info)["obj_reps_raw"]
        for b, k, whole in ((0, 0, False), (0, 1, True), (0, 2, False), (1, 0, False)):
            w, h = (int(v) for v in im_info[b, :2])
            expected = by_hand(encoder, images[b, :, :h, :w], boxes[b, k].tolist(), whole)
            torch.testing.assert_close(raw[b, k], expected, rtol=1e-5, atol=1e-5)


def test_each_image_runs_at_its_own_size_whatever_the_batch():
    """Images of two sizes (three images, two of one size): each box's feature equals that of its image run
    alone at its own size, unpadded (position embeddings interpolated to 8 x 12 and 4 x 5 patches)."""
    encoder = make_encoder()
    images, boxes, box_mask, im_info = batch()
    images = torch.cat((images, images[:1].flip(-1)))
    boxes = torch.cat((boxes, boxes[:1]))
    box_mask = torch.cat((box_mask, box_mask[:1]))
    im_info = torch.cat((im_info, im_info[:1]))
    with torch.no_grad():
        together = encoder(images, boxes, box_mask, im_info)["obj_reps_raw"]
        for b in range(3):
            w, h = (int(v) for v in im_info[b, :2])
            alone = encoder(images[b:b + 1, :, :h, :w], boxes[b:b + 1], box_mask[b:b + 1], im_info[b:b + 1])
            torch.testing.assert_close(together[b], alone["obj_reps_raw"][0], rtol=1e-5, atol=1e-5)


def test_frozen_blocks_get_no_gradient():
    encoder = make_encoder(IMAGE_VIT_FROZEN_BLOCKS=1).train()
    images, boxes, box_mask, im_info = batch()
    encoder(images, boxes, box_mask, im_info)["obj_reps"].sum().backward()
    frozen = ("patch_embed.", "cls_token", "pos_embed", "blocks.0.")
    for name, p in encoder.vit.named_parameters():
        if name.startswith(frozen):
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.requires_grad and p.grad is not None, name
    with pytest.raises(UserInputError, match="IMAGE_VIT_FROZEN_BLOCKS = 3: vit_tiny_patch16_224 has 2 blocks"):
        make_encoder(IMAGE_VIT_FROZEN_BLOCKS=3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_in_fp32_under_autocast_equals_fp32_attention(dtype):
    fp32 = make_encoder(IMAGE_ATTN_FP32=True)
    plain = make_encoder()
    x = torch.randn(2, 9, 24, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = plain.vit.blocks[0].attn(x)  # fp32, no autocast
        with torch.autocast("cpu", dtype=dtype):
            got = fp32.vit.blocks[0].attn(x)
            mixed = plain.vit.blocks[0].attn(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # exact: the same fp32 kernels on the same inputs
    assert mixed.dtype == dtype and not torch.equal(mixed.float(), expected)  # without the key: low precision
    assert fp32.state_dict().keys() == plain.state_dict().keys()  # timm's names stay


def test_gradient_checkpointing_gives_the_same_output_and_gradients():
    images, boxes, box_mask, im_info = batch()
    grads = []
    for checkpointing in (False, True):
        encoder = make_encoder(GRADIENT_CHECKPOINTING=checkpointing).train()
        encoder.obj_downsample[0].p = 0.0  # no dropout: the two runs draw no random numbers
        out = encoder(images, boxes, box_mask, im_info)["obj_reps"]
        out.sum().backward()
        grads.append((out.detach(), encoder.vit.blocks[0].attn.qkv.weight.grad))
    assert encoder.vit.grad_checkpointing
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=0)  # exact: one forward, recomputed
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-6, atol=1e-7)


def test_timm_weights_load_and_weights_of_another_architecture_name_the_expected_one(tmp_path):
    from safetensors.torch import save_file

    source = timm.create_model(ARCH, num_classes=5, **KWARGS).state_dict()  # a classifier the encoder drops
    save_file(source, str(tmp_path / "w.safetensors"))
    torch.save({"model": source}, str(tmp_path / "w.pth"))  # timm's training checkpoint layout
    for name in ("w.safetensors", "w.pth"):
        encoder = make_encoder(IMAGE_PRETRAINED=str(tmp_path / name))
        encoder.init_weight()
        for key in ("blocks.1.mlp.fc2.weight", "pos_embed", "cls_token"):
            assert torch.equal(encoder.vit.state_dict()[key], source[key])

    wider = timm.create_model(ARCH, num_classes=0, **dict(KWARGS, embed_dim=48)).state_dict()
    save_file(wider, str(tmp_path / "wide.safetensors"))
    torch.save(torch.nn.Conv2d(3, 8, 3).state_dict(), str(tmp_path / "conv.pth"))
    for name in ("wide.safetensors", "conv.pth"):
        encoder = make_encoder(IMAGE_PRETRAINED=str(tmp_path / name))
        with pytest.raises(UserInputError, match=r"another architecture than timm's vit_tiny_patch16_224"):
            encoder.init_weight()


def test_keys_of_one_encoder_are_refused_with_the_other():
    with pytest.raises(ConfigError, match=r"IMAGE_NUM_LAYERS = 101: only the ResNet image encoder reads it"):
        VCR_TASK.check_config(vit_config(IMAGE_NUM_LAYERS=101))
    resnet = VCR_TASK.load_config(None, ["NETWORK.IMAGE_ATTN_FP32", "True"])
    with pytest.raises(ConfigError, match=r"IMAGE_ATTN_FP32 = True: only the ViT image encoder"):
        VCR_TASK.check_config(resnet)
    with pytest.raises(ConfigError, match="IMAGE_ENCODER"):
        VCR_TASK.load_config(None, ["NETWORK.IMAGE_ENCODER", "swin"])
    VCR_TASK.check_config(vit_config(IMAGE_ATTN_FP32=True, IMAGE_VIT_FROZEN_BLOCKS=0))


def test_vit_weights_file_is_an_input_of_the_run(tmp_path):
    cfg = vit_config(IMAGE_PRETRAINED=str(tmp_path / "vit.safetensors"))
    found = [i for i in VCR_TASK.inputs(cfg) if i.key == "NETWORK.IMAGE_PRETRAINED"]
    assert [(i.what, i.path) for i in found] == [("timm ViT weights", str(tmp_path / "vit.safetensors"))]


def test_checkpoint_records_its_encoder_and_the_other_encoder_is_refused_naming_both():
    vit, resnet = vit_config(), VCR_TASK.load_config(None)
    saved = {"state_dict": {}, "config": yaml.safe_dump({"NETWORK": {"IMAGE_ENCODER": "vit"}})}
    assert checkpoint_image_encoder(saved) == "vit"
    # the reference's files have no config: their keys tell
    assert checkpoint_image_encoder({"state_dict": {"module.image_feature_extractor.backbone.conv1.weight": 0}}) \
        == "resnet"
    assert checkpoint_image_encoder({"state_dict": {"image_feature_extractor.vit.cls_token": 0}}) == "vit"
    check_checkpoint_encoder(vit, saved, "a.model")
    with pytest.raises(UserInputError, match=r"a\.model was trained with the image encoder NETWORK.IMAGE_ENCODER "
                                             r"'vit', but this config builds 'resnet'"):
        check_checkpoint_encoder(resnet, saved, "a.model")
