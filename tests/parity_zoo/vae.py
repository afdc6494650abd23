"""diffusers' VAE encoder (``AutoencoderKL.encoder``, NCHW) against a hand-written MLX port (NHWC).

The port keeps diffusers' module names (``conv_in``, ``down_blocks.N.resnets.M.norm1``,
``mid_block.attentions.0.to_q``, ...) and works channels-last as MLX convolutions do:
``mlx.nn.Conv2d`` (weights moved from OIHW to OHWI), ``GroupNorm(pytorch_compatible=True)``,
SiLU, the mid-block self-attention.  Its input is the same image transposed to NHWC.

The config makes the layout ambiguous on purpose: a 32x32 image and 32 channels after
``conv_in``, so every activation of the first block is (1, 32, 32, 32) on both sides
although one is NCHW and the other NHWC; shapes alone cannot tell that a transpose is
needed.  (The mid-block attention normalizes a (1, C, H*W) tensor in diffusers and a
(1, H*W, C) one in the port: a 3-D layout difference too.)  Modules diffusers calls
and the port does not have: ``resnets.M.dropout`` and ``attentions.0.to_out.1``
(dropouts, identities at inference).

Bugs and the module a verdict must name:

- ``groupnorm_groups``: ``down_blocks.1.resnets.0.norm2`` uses 4 groups instead of 8 ->
  that norm.
- ``attn_scale``: the mid-block attention forgets 1/sqrt(channels) ->
  ``mid_block.attentions.0``.
- ``downsample_padding``: the first downsampler pads top and left where diffusers pads
  right and bottom (``F.pad(x, (0, 1, 0, 1))`` misread) -> ``down_blocks.0.downsamplers.0``;
  its conv is right and gets a shifted input (the classic VAE port slip).
- ``skipped_norm``: the encoder never calls ``conv_norm_out`` (SiLU straight on the
  mid block's output) -> ``conv_norm_out``, the module the port never calls.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as mnn
import torch

from .core import TORCH_DTYPES, ZooPort, check_case, generator, init_o1, to_mlx

BUGS = ("groupnorm_groups", "attn_scale", "downsample_padding", "skipped_norm")
CULPRITS = {
    "groupnorm_groups": "down_blocks.1.resnets.0.norm2",
    "attn_scale": "mid_block.attentions.0",
    "downsample_padding": "down_blocks.0.downsamplers.0",
    "skipped_norm": "conv_norm_out",
}


@dataclass(frozen=True)
class Sizes:
    in_channels: int = 3
    latent_channels: int = 4
    block_out_channels: tuple[int, ...] = (32, 64)
    layers_per_block: int = 1
    norm_num_groups: int = 8
    sample_size: int = 32  # == block_out_channels[0]: the ambiguous layout
    eps: float = 1e-6


SIZES = Sizes()


@functools.cache
def reference(dtype: str, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    """The encoder of a tiny ``AutoencoderKL`` in ``dtype`` and one NCHW image."""
    from diffusers import AutoencoderKL

    s = SIZES
    gen = generator(seed)
    vae: Any = AutoencoderKL(
        in_channels=s.in_channels,
        out_channels=s.in_channels,
        down_block_types=("DownEncoderBlock2D",) * len(s.block_out_channels),
        up_block_types=("UpDecoderBlock2D",) * len(s.block_out_channels),
        block_out_channels=s.block_out_channels,
        layers_per_block=s.layers_per_block,
        latent_channels=s.latent_channels,
        norm_num_groups=s.norm_num_groups,
        sample_size=s.sample_size,
    )
    encoder = vae.encoder
    init_o1(encoder, gen)
    encoder = encoder.to(TORCH_DTYPES[dtype]).eval()
    image = torch.randn(1, s.in_channels, s.sample_size, s.sample_size, generator=gen)
    return encoder, image.to(TORCH_DTYPES[dtype])


def _group_norm(channels: int) -> mnn.GroupNorm:
    return mnn.GroupNorm(SIZES.norm_num_groups, channels, eps=SIZES.eps, pytorch_compatible=True)


class ResnetBlock(mnn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm1 = _group_norm(cin)
        self.conv1 = mnn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = _group_norm(cout)
        self.conv2 = mnn.Conv2d(cout, cout, 3, padding=1)
        self.nonlinearity = mnn.SiLU()
        if cin != cout:
            self.conv_shortcut = mnn.Conv2d(cin, cout, 1)

    def __call__(self, x: mx.array) -> mx.array:
        h = self.conv1(self.nonlinearity(self.norm1(x)))
        h = self.conv2(self.nonlinearity(self.norm2(h)))
        shortcut = self.conv_shortcut(x) if "conv_shortcut" in self else x
        return shortcut + h


class Downsample(mnn.Module):
    """diffusers' Downsample2D with ``padding=0``: pad right and bottom by one, conv stride 2."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = mnn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def __call__(self, x: mx.array) -> mx.array:
        return self.conv(mx.pad(x, [(0, 0), (0, 1), (0, 1), (0, 0)]))


class DownBlock(mnn.Module):
    def __init__(self, cin: int, cout: int, downsample: bool) -> None:
        super().__init__()
        self.resnets = [
            ResnetBlock(cin if i == 0 else cout, cout) for i in range(SIZES.layers_per_block)
        ]
        if downsample:
            self.downsamplers = [Downsample(cout)]

    def __call__(self, x: mx.array) -> mx.array:
        for resnet in self.resnets:
            x = resnet(x)
        for down in self.get("downsamplers", []):
            x = down(x)
        return x


class SelfAttention(mnn.Module):
    """diffusers' single-head ``Attention`` of the mid block, on NHWC input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.group_norm = _group_norm(channels)
        self.to_q = mnn.Linear(channels, channels)
        self.to_k = mnn.Linear(channels, channels)
        self.to_v = mnn.Linear(channels, channels)
        self.to_out = [mnn.Linear(channels, channels)]
        self.scale = channels**-0.5

    def __call__(self, x: mx.array) -> mx.array:
        B, H, W, C = x.shape
        h = self.group_norm(x.reshape(B, H * W, C))
        q, k, v = (p(h)[:, None] for p in (self.to_q, self.to_k, self.to_v))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return x + self.to_out[0](out[:, 0]).reshape(B, H, W, C)


class MidBlock(mnn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.attentions = [SelfAttention(channels)]
        self.resnets = [ResnetBlock(channels, channels), ResnetBlock(channels, channels)]

    def __call__(self, x: mx.array) -> mx.array:
        x = self.resnets[0](x)
        return self.resnets[1](self.attentions[0](x))


class Encoder(mnn.Module):
    def __init__(self, s: Sizes) -> None:
        super().__init__()
        channels = s.block_out_channels
        self.conv_in = mnn.Conv2d(s.in_channels, channels[0], 3, padding=1)
        self.down_blocks = [
            DownBlock(channels[max(i - 1, 0)], c, downsample=i < len(channels) - 1)
            for i, c in enumerate(channels)
        ]
        self.mid_block = MidBlock(channels[-1])
        self.conv_norm_out = _group_norm(channels[-1])
        self.conv_act = mnn.SiLU()
        self.conv_out = mnn.Conv2d(channels[-1], 2 * s.latent_channels, 3, padding=1)

    def __call__(self, x: mx.array) -> mx.array:
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(self.conv_act(self.conv_norm_out(x)))


# -- the decoder (a pipeline's last stage) -------------------------------------------------------


@functools.cache
def decoder_reference(seed: int = 0) -> torch.nn.Module:
    """The decoder of the same tiny ``AutoencoderKL`` (float32): latents (1, 4, H, W) to an
    image (1, 3, 2H, 2W), one upsampling."""
    from diffusers import AutoencoderKL

    s = SIZES
    gen = generator(seed + 1)
    vae: Any = AutoencoderKL(
        in_channels=s.in_channels,
        out_channels=s.in_channels,
        down_block_types=("DownEncoderBlock2D",) * len(s.block_out_channels),
        up_block_types=("UpDecoderBlock2D",) * len(s.block_out_channels),
        block_out_channels=s.block_out_channels,
        layers_per_block=s.layers_per_block,
        latent_channels=s.latent_channels,
        norm_num_groups=s.norm_num_groups,
        sample_size=s.sample_size,
    )
    decoder = vae.decoder
    init_o1(decoder, gen)
    return decoder.eval()


class Upsample(mnn.Module):
    """diffusers' Upsample2D: nearest-neighbour x2, then a 3x3 conv.  ``linear=True`` is
    the port slip of reaching for ``nn.Upsample(mode="linear")``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = mnn.Conv2d(channels, channels, 3, padding=1)
        self.linear = False

    def __call__(self, x: mx.array) -> mx.array:
        if self.linear:
            x = mnn.Upsample(scale_factor=2.0, mode="linear", align_corners=False)(x)
        else:
            x = mx.repeat(mx.repeat(x, 2, axis=1), 2, axis=2)
        return self.conv(x)


class UpBlock(mnn.Module):
    def __init__(self, cin: int, cout: int, upsample: bool) -> None:
        super().__init__()
        self.resnets = [
            ResnetBlock(cin if i == 0 else cout, cout) for i in range(SIZES.layers_per_block + 1)
        ]
        if upsample:
            self.upsamplers = [Upsample(cout)]

    def __call__(self, x: mx.array) -> mx.array:
        for resnet in self.resnets:
            x = resnet(x)
        for up in self.get("upsamplers", []):
            x = up(x)
        return x


class Decoder(mnn.Module):
    """diffusers' VAE ``Decoder`` in NHWC: conv_in, mid block, up blocks (widest first),
    GroupNorm, SiLU, conv_out."""

    def __init__(self, s: Sizes = SIZES) -> None:
        super().__init__()
        widest_first = list(reversed(s.block_out_channels))
        self.conv_in = mnn.Conv2d(s.latent_channels, widest_first[0], 3, padding=1)
        self.mid_block = MidBlock(widest_first[0])
        self.up_blocks = [
            UpBlock(widest_first[max(i - 1, 0)], c, upsample=i < len(widest_first) - 1)
            for i, c in enumerate(widest_first)
        ]
        self.conv_norm_out = _group_norm(widest_first[-1])
        self.conv_act = mnn.SiLU()
        self.conv_out = mnn.Conv2d(widest_first[-1], s.in_channels, 3, padding=1)

    def __call__(self, z: mx.array) -> mx.array:
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(self.conv_act(self.conv_norm_out(x)))


def decoder_port(ref: torch.nn.Module, bug: str | None = None) -> Decoder:
    """The MLX decoder with ``ref``'s weights; ``bug="upsample"`` plants the linear
    upsampling in ``up_blocks.0.upsamplers.0``."""
    port = Decoder()
    port.load_weights([(k, port_weight(v)) for k, v in ref.state_dict().items()])
    port.eval()
    if bug == "upsample":
        port.up_blocks[0].upsamplers[0].linear = True
    return port


def port_weight(value: torch.Tensor) -> mx.array:
    """OIHW conv kernels become OHWI; everything else moves as is."""
    return to_mlx(value.permute(0, 2, 3, 1) if value.ndim == 4 else value)


def _padding_on_the_wrong_side(cls: type) -> type:
    class PaddingOnTheWrongSide(cls):  # type: ignore[misc, valid-type]
        """The bug: one row and column of zeros before the image instead of after it."""

        def __call__(self, x: mx.array) -> mx.array:
            return self.conv(mx.pad(x, [(0, 0), (1, 0), (1, 0), (0, 0)]))

    return PaddingOnTheWrongSide


def _encoder_without_final_norm(cls: type) -> type:
    class EncoderWithoutFinalNorm(cls):  # type: ignore[misc, valid-type]
        """The bug: ``conv_norm_out`` is never called."""

        def __call__(self, x: mx.array) -> mx.array:
            x = self.conv_in(x)
            for block in self.down_blocks:
                x = block(x)
            return self.conv_out(self.conv_act(self.mid_block(x)))

    return EncoderWithoutFinalNorm


def build(dtype: str = "float32", bug: str | None = None, *, seed: int = 0) -> ZooPort:
    """diffusers' VAE encoder vs the MLX ``Encoder`` (NHWC), ``bug`` planted in the port."""
    check_case("vae", dtype, bug, BUGS)
    ref, image = reference(dtype, seed)
    port = Encoder(SIZES)
    port.load_weights([(k, port_weight(v)) for k, v in ref.state_dict().items()])
    port.eval()
    if bug == "groupnorm_groups":
        norm = port.down_blocks[1].resnets[0].norm2
        norm.num_groups = SIZES.norm_num_groups // 2
    elif bug == "attn_scale":
        port.mid_block.attentions[0].scale = 1.0
    elif bug == "downsample_padding":
        down = port.down_blocks[0].downsamplers[0]
        down.__class__ = _padding_on_the_wrong_side(type(down))
    elif bug == "skipped_norm":
        port.__class__ = _encoder_without_final_norm(type(port))
    return ZooPort(
        arch="vae",
        dtype=dtype,
        bug=bug,
        ref=ref,
        port=port,
        ref_inputs=(image,),
        port_inputs=(to_mlx(image.permute(0, 2, 3, 1)),),
        culprit=CULPRITS[bug] if bug else None,
        layout="NHWC",
    )
