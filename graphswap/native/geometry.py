"""Convolution geometry: TensorFlow's 'SAME'/'VALID' rules turned into explicit paddings.

The C ABI receives explicit paddings, strides and dilations (graphswap_conv2d_params); this module is
the one place that derives them, exactly as TensorFlow does, so every kernel sees the same geometry.
"""

from __future__ import annotations

import dataclasses

from graphswap.errors import ShapeError


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """Field-for-field mirror of graphswap_conv2d_params (NHWC input, HWIO filter)."""

    batch: int
    in_height: int
    in_width: int
    in_channels: int
    filter_height: int
    filter_width: int
    out_channels: int
    out_height: int
    out_width: int
    stride_height: int
    stride_width: int
    dilation_height: int
    dilation_width: int
    pad_top: int
    pad_bottom: int
    pad_left: int
    pad_right: int
    groups: int

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.out_height, self.out_width, self.out_channels)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of one forward pass over the batch."""
        return (self.batch * self.out_height * self.out_width * self.out_channels
                * self.filter_height * self.filter_width * (self.in_channels // self.groups))


def _same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int, int]:
    effective = (kernel - 1) * dilation + 1
    out = -(-size // stride)  # ceil
    total = max((out - 1) * stride + effective - size, 0)
    return out, total // 2, total - total // 2


def _valid_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int, int]:
    effective = (kernel - 1) * dilation + 1
    out = max((size - effective) // stride + 1, 0) if size >= effective else 0
    return out, 0, 0


def conv_geometry(input_shape, filter_shape, strides=(1, 1), dilations=(1, 1),
                  padding="valid", groups=1) -> ConvGeometry:
    """Geometry of a 2-D convolution of an NHWC input with an HWIO filter.

    `padding` is 'valid' or 'same' (case-insensitive), as Keras' Conv2D accepts.
    """
    batch, in_h, in_w, in_c = (int(d) for d in input_shape)
    f_h, f_w, f_in, out_c = (int(d) for d in filter_shape)
    groups = int(groups)
    if f_in * groups != in_c:
        raise ShapeError(
            f"filter input depth {f_in} x groups {groups} != input channels {in_c}; the filter "
            f"must have in_channels / groups input channels")
    rule = {"same": _same_padding, "valid": _valid_padding}.get(str(padding).lower())
    if rule is None:
        raise ShapeError(f"padding must be 'valid' or 'same', got {padding!r}")
    s_h, s_w = (int(s) for s in strides)
    d_h, d_w = (int(d) for d in dilations)
    out_h, pad_top, pad_bottom = rule(in_h, f_h, s_h, d_h)
    out_w, pad_left, pad_right = rule(in_w, f_w, s_w, d_w)
    return ConvGeometry(batch, in_h, in_w, in_c, f_h, f_w, out_c, out_h, out_w, s_h, s_w, d_h, d_w,
                        pad_top, pad_bottom, pad_left, pad_right, groups)
