"""A transposed convolution (Conv2DTranspose) as an ordinary stride-1 convolution, in numpy.

TensorFlow computes Conv2DTranspose as the input gradient of a convolution (Conv2DBackpropInput):
the convolution that maps an output-sized tensor (Keras' output shape rule, with its
output_padding) to the input with the layer's strides, dilations and SAME/VALID padding.  The same
numbers are a stride-1 convolution - with the same dilation - of the input with zeros inserted
between its samples (stride - 1 of them), padded by (kernel extent - 1 - that convolution's
padding) before and whatever completes the output size after, with the filter flipped in both
spatial axes and its two channel axes swapped (Keras' (h, w, filters, in) -> HWIO (h, w, in,
filters)).  Every product of the transposed convolution, and only those plus products with the
inserted zeros, then goes through the kernel's conv2d.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from graphswap.errors import ShapeError
from graphswap.native.geometry import ConvGeometry, conv_geometry


def transposed_output_length(size: int, kernel: int, stride: int, padding: str,
                             output_padding, dilation: int) -> int:
    """Keras' Conv2DTranspose output length (keras backend_utils, TensorFlow padding rule)."""
    extent = (kernel - 1) * dilation + 1
    if str(padding).lower() == "valid":
        extra = max(extent, stride) - extent if output_padding is None else output_padding
        return (size - 1) * stride + extent + extra
    if output_padding is None:
        return size * stride
    return (size - 1) * stride + extent % 2 + output_padding


@dataclasses.dataclass(frozen=True)
class TransposedConv:
    """How one Conv2DTranspose call runs as a stride-1 convolution (module docstring)."""

    strides: tuple[int, int]
    inserted_height: int       # (in_h - 1) * stride_h + 1, before cropping
    inserted_width: int
    crop_height: int           # rows/columns of the zero-inserted input kept (a negative
    crop_width: int            # after-padding is a crop)
    geometry: ConvGeometry     # the stride-1 convolution over the (cropped) zero-inserted input
    forward: ConvGeometry      # the convolution it is the transpose of (output -> input sizes)

    @property
    def output_shape(self):
        return self.geometry.output_shape


def transposed_conv(input_shape, kernel_shape, strides, padding, output_padding=None,
                    dilations=(1, 1)) -> TransposedConv:
    """The plan for an NHWC input and a Keras Conv2DTranspose kernel (h, w, filters, in)."""
    batch, in_h, in_w, in_c = (int(d) for d in input_shape)
    k_h, k_w, filters, k_in = (int(d) for d in kernel_shape)
    if k_in != in_c:
        raise ShapeError(f"Conv2DTranspose kernel has {k_in} input channels, the input {in_c}")
    s_h, s_w = (int(s) for s in strides)
    d_h, d_w = (int(d) for d in dilations)
    pads = (None, None) if output_padding is None else tuple(int(p) for p in output_padding)
    out_h = transposed_output_length(in_h, k_h, s_h, padding, pads[0], d_h)
    out_w = transposed_output_length(in_w, k_w, s_w, padding, pads[1], d_w)
    forward = conv_geometry((batch, out_h, out_w, filters), (k_h, k_w, filters, in_c),
                            (s_h, s_w), (d_h, d_w), padding)
    if (forward.out_height, forward.out_width) != (in_h, in_w):
        raise ShapeError(
            f"Conv2DTranspose of a {in_h}x{in_w} input to {out_h}x{out_w} is not the transpose of "
            f"a {padding!r} convolution (TensorFlow rejects it too); change output_padding")
    z_h, z_w = (in_h - 1) * s_h + 1, (in_w - 1) * s_w + 1
    top = (k_h - 1) * d_h - forward.pad_top
    left = (k_w - 1) * d_w - forward.pad_left
    bottom = out_h + (k_h - 1) * d_h - top - z_h
    right = out_w + (k_w - 1) * d_w - left - z_w
    crop_h, crop_w = z_h + min(bottom, 0), z_w + min(right, 0)
    geometry = ConvGeometry(batch, crop_h, crop_w, in_c, k_h, k_w, filters, out_h, out_w, 1, 1,
                            d_h, d_w, top, max(bottom, 0), left, max(right, 0), 1)
    return TransposedConv((s_h, s_w), z_h, z_w, crop_h, crop_w, geometry, forward)


def insert_zeros(x: np.ndarray, plan: TransposedConv) -> np.ndarray:
    """NHWC input with stride - 1 zeros between samples, cropped as the plan says."""
    s_h, s_w = plan.strides
    z = np.zeros((x.shape[0], plan.inserted_height, plan.inserted_width, x.shape[3]),
                 dtype=np.float32)
    z[:, ::s_h, ::s_w, :] = x
    return np.ascontiguousarray(z[:, :plan.crop_height, :plan.crop_width, :])


def remove_zeros(dz: np.ndarray, plan: TransposedConv, input_shape) -> np.ndarray:
    """Adjoint of insert_zeros: the samples of `dz` that came from the input."""
    full = np.zeros((dz.shape[0], plan.inserted_height, plan.inserted_width, dz.shape[3]),
                    dtype=np.float32)
    full[:, :plan.crop_height, :plan.crop_width, :] = dz
    s_h, s_w = plan.strides
    return np.ascontiguousarray(full[:, ::s_h, ::s_w, :][:, :input_shape[1], :input_shape[2], :])


def flipped_filter(kernel: np.ndarray) -> np.ndarray:
    """Keras' (h, w, filters, in) transposed-conv kernel as the HWIO (h, w, in, filters) filter of
    the equivalent convolution, flipped in both spatial axes."""
    return np.ascontiguousarray(np.transpose(kernel[::-1, ::-1], (0, 1, 3, 2)),
                                dtype=np.float32)


def unflipped_filter(filter_gradient: np.ndarray) -> np.ndarray:
    """Adjoint of flipped_filter (for the filter's gradient)."""
    return np.ascontiguousarray(np.transpose(filter_gradient, (0, 1, 3, 2))[::-1, ::-1],
                                dtype=np.float32)


# --------------------------------------------------------------------------------------------
# the sub-pixel formulation: no inserted zeros
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SubpixelPhase:
    """One phase of one spatial axis: the outputs o with o % stride == residue, as the stride-1
    convolution of the (padded or cropped) input with the kernel's taps first_tap, first_tap +
    stride, ... (reversed: a correlation)."""

    residue: int      # o % stride of the outputs this phase computes
    first_tap: int    # the phase's taps of the kernel axis: first_tap::stride
    taps: int
    outputs: int      # how many outputs (ceil((out_len - residue) / stride))
    pad_before: int   # input positions added before (negative: the input's first ones dropped)
    pad_after: int    # and after (negative: dropped)


@dataclasses.dataclass(frozen=True)
class SubpixelPlan:
    """Conv2DTranspose as stride_h * stride_w stride-1 convolutions of the input itself (no
    zeros inserted), one per (row phase, column phase), interleaved into the output: every
    product of the transposed convolution and no product with an inserted zero."""

    strides: tuple[int, int]
    output_height: int
    output_width: int
    rows: tuple[SubpixelPhase, ...]     # ordered by residue
    columns: tuple[SubpixelPhase, ...]

    @property
    def crops(self) -> bool:
        """Whether some phase drops input positions (its window never reaches them)."""
        return any(p.pad_before < 0 or p.pad_after < 0 for p in self.rows + self.columns)

    @property
    def blocks(self) -> tuple[int, int]:
        """(ceil(out_h / s_h), ceil(out_w / s_w)): each phase's output padded to this before the
        phases interleave (then cropped to the output)."""
        return (self.rows[0].outputs, self.columns[0].outputs)

    def phase_geometry(self, batch: int, in_channels: int, filters: int, row: SubpixelPhase,
                       column: SubpixelPhase, in_height: int, in_width: int) -> ConvGeometry:
        """The stride-1 convolution of one phase over the input cropped by the phase's negative
        paddings (`in_height`, `in_width`: that cropped input's size)."""
        return ConvGeometry(batch, in_height, in_width, in_channels, row.taps, column.taps,
                            filters, row.outputs, column.outputs, 1, 1, 1, 1,
                            max(row.pad_before, 0), max(row.pad_after, 0),
                            max(column.pad_before, 0), max(column.pad_after, 0), 1)


def _axis_phases(size: int, kernel: int, stride: int, before: int, out_len: int):
    """The phases of one axis: out[o] = sum over taps t, inputs i with i * stride + t - before
    == o of x[i] K[t]; None where some phase has no tap or no output (the zero-inserted
    formulation handles those)."""
    phases = []
    for first_tap in range(stride):
        taps = -(-(kernel - first_tap) // stride)
        q0 = -((first_tap - before) // stride)          # ceil((before - first_tap) / stride)
        q1 = (out_len - 1 + before - first_tap) // stride
        outputs = q1 - q0 + 1
        if taps <= 0 or outputs <= 0:
            return None
        pad_before = taps - 1 - q0
        pad_after = outputs + taps - 1 - size - pad_before
        phases.append(SubpixelPhase(q0 * stride + first_tap - before, first_tap, taps, outputs,
                                    pad_before, pad_after))
    return tuple(sorted(phases, key=lambda p: p.residue))


def subpixel_plan(input_shape, kernel_shape, strides, padding, output_padding=None,
                  dilations=(1, 1)) -> SubpixelPlan | None:
    """The sub-pixel plan of a Conv2DTranspose (same arguments as transposed_conv), or None
    where it does not apply: dilations > 1, a kernel smaller than its stride (phases without
    taps), or an input too small for every phase to have outputs."""
    plan = transposed_conv(input_shape, kernel_shape, strides, padding, output_padding,
                           dilations)
    if max(int(d) for d in dilations) > 1:
        return None
    g = plan.geometry
    rows = _axis_phases(int(input_shape[1]), g.filter_height, plan.strides[0],
                        g.filter_height - 1 - g.pad_top, g.out_height)
    columns = _axis_phases(int(input_shape[2]), g.filter_width, plan.strides[1],
                           g.filter_width - 1 - g.pad_left, g.out_width)
    if rows is None or columns is None:
        return None
    return SubpixelPlan(plan.strides, g.out_height, g.out_width, rows, columns)


def subpixel_filter(kernel: np.ndarray, row: SubpixelPhase, column: SubpixelPhase,
                    strides) -> np.ndarray:
    """numpy: one phase's HWIO filter from a Keras (h, w, filters, in) transposed-conv kernel."""
    part = kernel[row.first_tap::strides[0], column.first_tap::strides[1]][::-1, ::-1]
    return np.ascontiguousarray(np.transpose(part, (0, 1, 3, 2)), dtype=np.float32)


# --------------------------------------------------------------------------------------------
# the sub-pixel phases merged into one convolution
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MergedAxis:
    """One spatial axis of the phases merged into one stride-1 convolution: a window of `taps`
    positions over the input padded by `pad_before` / `pad_after`, each phase's taps at
    `offsets[phase]` within it (the other positions hold zero weights).  Output `shift + b` of
    the merged convolution is block b of every phase; it computes `outputs` of them (at least
    shift + blocks, and enough that no input position is cropped)."""

    taps: int
    pad_before: int
    pad_after: int
    outputs: int
    shift: int
    offsets: tuple[int, ...]     # per phase, in residue order


def _merged_axis(phases: tuple[SubpixelPhase, ...], size: int) -> MergedAxis:
    # phase r's block b reads input positions b - pad_before_r + j (j < taps_r): with a common
    # padding L and output shift c, its first tap sits at L - c - pad_before_r = D - pad_before_r
    reach = max(p.pad_before for p in phases)
    pad_before, shift = max(reach, 0), max(-reach, 0)
    offsets = tuple(reach - p.pad_before for p in phases)
    taps = max(o + p.taps for o, p in zip(offsets, phases))
    blocks = phases[0].outputs
    outputs = max(shift + blocks, size + pad_before - taps + 1)
    return MergedAxis(taps, pad_before, outputs - 1 + taps - size - pad_before, outputs, shift,
                      offsets)


@dataclasses.dataclass(frozen=True)
class MergedSubpixel:
    """The sub-pixel phases of a SubpixelPlan as ONE stride-1 convolution of the input with
    stride_h * stride_w * filters output channels (phase-major: (row residue, column residue,
    filter)): one pass over the input and one GEMM instead of one per phase, at the price of the
    zero weights that pad each phase's taps to the common window (products with a real 0)."""

    plan: SubpixelPlan
    rows: MergedAxis
    columns: MergedAxis

    def geometry(self, in_height: int, in_width: int, in_channels: int,
                 filters: int) -> ConvGeometry:
        """The merged convolution (any batch: traced with 1)."""
        s_h, s_w = self.plan.strides
        return ConvGeometry(1, in_height, in_width, in_channels, self.rows.taps,
                            self.columns.taps, s_h * s_w * filters, self.rows.outputs,
                            self.columns.outputs, 1, 1, 1, 1, self.rows.pad_before,
                            self.rows.pad_after, self.columns.pad_before,
                            self.columns.pad_after, 1)

    def filter_index(self, kernel_height: int, kernel_width: int) -> np.ndarray:
        """int (taps_h, taps_w, s_h * s_w): for each window position and phase, the flat index
        (row * kernel_width + column) of the Keras kernel tap there, or kernel_height *
        kernel_width where the position holds a zero weight (phase-major, residue order)."""
        s_h, s_w = self.plan.strides
        zero = kernel_height * kernel_width
        index = np.full((self.rows.taps, self.columns.taps, s_h, s_w), zero, np.int64)
        for r, (row, top) in enumerate(zip(self.plan.rows, self.rows.offsets)):
            for c, (column, left) in enumerate(zip(self.plan.columns, self.columns.offsets)):
                for i in range(row.taps):            # a phase's taps reversed: a correlation
                    for j in range(column.taps):
                        tap_h = row.first_tap + s_h * (row.taps - 1 - i)
                        tap_w = column.first_tap + s_w * (column.taps - 1 - j)
                        index[top + i, left + j, r, c] = tap_h * kernel_width + tap_w
        return index.reshape(self.rows.taps, self.columns.taps, s_h * s_w)


def merged_filter_gather(merged: MergedSubpixel, kernel_shape, extra_channels: int = 0) -> np.ndarray:
    """int32 (taps_h, taps_w, in + extra_channels, s_h * s_w * filters): for each entry of the
    merged convolution's HWIO filter, its index into the Keras kernel (h, w, filters, in)
    flattened, followed by one zero and then `extra_channels` x filters values (each phase's
    channel f gets extra value [e, f] as its tap (0, 0) of input channel in + e; its other taps
    of those channels are the zero) - one gather builds the filter."""
    k_h, k_w, filters, channels = (int(d) for d in kernel_shape)
    zero = k_h * k_w * filters * channels
    taps = merged.filter_index(k_h, k_w)                       # (T_h, T_w, P)
    f = np.arange(filters)[None, None, None, :, None]          # (.., P, filters, in)
    c = np.arange(channels)[None, None, None, None, :]
    index = np.where(taps[..., None, None] == k_h * k_w, zero,
                     (taps[..., None, None] * filters + f) * channels + c)
    index = np.transpose(index, (0, 1, 4, 2, 3))               # (T_h, T_w, in, P, filters)
    if extra_channels:
        extra = np.full(index.shape[:2] + (extra_channels,) + index.shape[3:], zero)
        extra[0, 0] = zero + 1 + np.arange(extra_channels)[:, None, None] * filters + \
            np.arange(filters)[None, None, :]
        index = np.concatenate([index, extra], axis=2)
    return index.reshape(*index.shape[:3], -1).astype(np.int32)


def merged_subpixel(plan: SubpixelPlan, in_height: int, in_width: int) -> MergedSubpixel:
    """The phases of `plan` (for an input of in_height x in_width) merged into one convolution."""
    return MergedSubpixel(plan, _merged_axis(plan.rows, in_height),
                          _merged_axis(plan.columns, in_width))


def merged_filter(kernel: np.ndarray, merged: MergedSubpixel) -> np.ndarray:
    """numpy: the merged convolution's HWIO filter from a Keras (h, w, filters, in) kernel."""
    k_h, k_w, filters, channels = kernel.shape
    taps = np.concatenate([kernel.reshape(k_h * k_w, filters, channels),
                           np.zeros((1, filters, channels), kernel.dtype)])
    w = taps[merged.filter_index(k_h, k_w)]            # (T_h, T_w, P, filters, in)
    w = np.transpose(w, (0, 1, 4, 2, 3))
    return np.ascontiguousarray(w.reshape(*w.shape[:3], -1), dtype=np.float32)
