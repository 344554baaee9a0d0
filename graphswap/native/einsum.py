"""An EinsumDense equation lowered to one (m, k) x (k, n) matrix product, in numpy.

`input,kernel->output` (Keras' EinsumDense form, e.g. "abc,cde->abde" for a MultiHeadAttention
query projection) is resolved into three groups of labels:

    free        in the input and the output, not the kernel (batch, sequence; "..." too) -> m
    contracted  in the input and the kernel, not the output                             -> k
    produced    in the kernel and the output, not the input                             -> n

so the einsum is: transpose the input to (free..., contracted...), reshape to (m, k); transpose
the kernel to (contracted..., produced...), reshape to (k, n); multiply; reshape to
(free..., produced...) and transpose to the output's order.  Equations outside that class - a
label in all three operands (a weight batched over an input axis), a label summed away in one
operand only, a repeated label, "..." in the kernel or on one side only - are refused, naming
the equation; EinsumDense in Keras' documentation and every MultiHeadAttention projection are in
the class.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from graphswap.errors import UnsupportedLayerError

_EQUATION = re.compile(r"^([a-zA-Z.]+),([a-zA-Z]+)->([a-zA-Z.]+)$")
ELLIPSIS = "..."


@dataclasses.dataclass(frozen=True)
class EinsumPlan:
    """The transposes and reshapes around the one matmul (see the module docstring).

    Permutations are over the operands' axes, with "..." expanded to `ellipsis_rank` axes."""

    equation: str
    input_labels: tuple[str, ...]      # per input axis ("..." expanded to "0", "1", ...)
    kernel_labels: tuple[str, ...]
    output_labels: tuple[str, ...]
    free: tuple[str, ...]              # in input order
    contracted: tuple[str, ...]        # in kernel order
    produced: tuple[str, ...]          # in kernel order

    @property
    def input_permutation(self) -> list[int]:
        return [self.input_labels.index(c) for c in self.free + self.contracted]

    @property
    def kernel_permutation(self) -> list[int]:
        return [self.kernel_labels.index(c) for c in self.contracted + self.produced]

    @property
    def output_permutation(self) -> list[int]:
        """Axes of the (free..., produced...) product in the output's order."""
        order = self.free + self.produced
        return [order.index(c) for c in self.output_labels]

    @property
    def input_inverse_permutation(self) -> list[int]:
        return list(np.argsort(self.input_permutation))

    @property
    def kernel_inverse_permutation(self) -> list[int]:
        return list(np.argsort(self.kernel_permutation))

    def sizes(self, input_shape, kernel_shape) -> dict:
        sizes = {}
        for labels, shape in ((self.input_labels, input_shape), (self.kernel_labels, kernel_shape)):
            for label, size in zip(labels, shape):
                sizes.setdefault(label, size)
        return sizes

    def kernel_matrix_shape(self, kernel_shape) -> tuple[int, int]:
        sizes = self.sizes((), kernel_shape)
        k = int(np.prod([sizes[c] for c in self.contracted], dtype=np.int64))
        n = int(np.prod([sizes[c] for c in self.produced], dtype=np.int64))
        return k, n

    def output_shape(self, input_shape, kernel_shape) -> list:
        sizes = self.sizes(input_shape, kernel_shape)
        return [sizes[c] for c in self.output_labels]

    def macs(self, input_shape, kernel_shape) -> int:
        """Multiply-accumulates per sample (the first input axis is the batch)."""
        sizes = self.sizes(input_shape, kernel_shape)
        per_sample = [sizes[c] for c in self.free if c != self.input_labels[0]]
        k, n = self.kernel_matrix_shape(kernel_shape)
        return int(np.prod(per_sample, dtype=np.int64)) * k * n

    # -- numpy application (the kernel's forward and backward products) -------------------
    def to_matrices(self, x: np.ndarray, w: np.ndarray):
        k, n = self.kernel_matrix_shape(w.shape)
        x2 = np.ascontiguousarray(np.transpose(x, self.input_permutation)).reshape(-1, k)
        w2 = np.ascontiguousarray(np.transpose(w, self.kernel_permutation)).reshape(k, n)
        return x2, w2

    def from_product(self, y2: np.ndarray, input_shape, kernel_shape) -> np.ndarray:
        sizes = self.sizes(input_shape, kernel_shape)
        y = y2.reshape([sizes[c] for c in self.free + self.produced])
        return np.ascontiguousarray(np.transpose(y, self.output_permutation))

    def product_of_output(self, dy: np.ndarray) -> np.ndarray:
        """The output (e.g. its gradient) as the (m, n) product matrix."""
        perm = [self.output_labels.index(c) for c in self.free + self.produced]
        n = int(np.prod([dy.shape[self.output_labels.index(c)] for c in self.produced],
                        dtype=np.int64))
        return np.ascontiguousarray(np.transpose(dy, perm)).reshape(-1, n)

    def input_of_matrix(self, x2: np.ndarray, input_shape) -> np.ndarray:
        permuted = [input_shape[i] for i in self.input_permutation]
        return np.ascontiguousarray(np.transpose(x2.reshape(permuted),
                                                 self.input_inverse_permutation))

    def kernel_of_matrix(self, w2: np.ndarray, kernel_shape) -> np.ndarray:
        permuted = [kernel_shape[i] for i in self.kernel_permutation]
        return np.ascontiguousarray(np.transpose(w2.reshape(permuted),
                                                 self.kernel_inverse_permutation))


def _refuse(equation: str, why: str):
    raise UnsupportedLayerError(
        f"einsum equation {equation!r} is not supported: {why}; supported: 'input,kernel->output' "
        f"where every label is in exactly two operands (e.g. 'ab,bc->ac', 'abc,cd->abd', "
        f"'abc,cde->abde', 'abcd,cde->abe', '...b,bc->...c')")


def einsum_plan(equation: str, input_rank: int) -> EinsumPlan:
    """Resolve `equation` for an input of rank `input_rank` (module docstring)."""
    compact = str(equation).replace(" ", "")
    match = _EQUATION.match(compact)
    if match is None:
        _refuse(equation, "it is not of the form 'input,kernel->output' with one kernel")
    lhs, kernel, out = match.groups()
    for operand in (lhs, out):
        rest = operand.replace(ELLIPSIS, "", 1)
        if "." in rest:
            _refuse(equation, "'.' only appears as one '...'")
    if (ELLIPSIS in lhs) != (ELLIPSIS in out):
        _refuse(equation, "'...' must be in both the input and the output")
    named = len(lhs.replace(ELLIPSIS, ""))
    ellipsis_rank = input_rank - named if ELLIPSIS in lhs else 0
    if ellipsis_rank < 0 or (ELLIPSIS not in lhs and named != input_rank):
        _refuse(equation, f"its input has {named} labels but the layer's input has rank "
                          f"{input_rank}")
    filler = tuple(str(i) for i in range(ellipsis_rank))

    def expand(operand: str) -> tuple[str, ...]:
        if ELLIPSIS not in operand:
            return tuple(operand)
        before, after = operand.split(ELLIPSIS)
        return tuple(before) + filler + tuple(after)

    x_labels, w_labels, y_labels = expand(lhs), tuple(kernel), expand(out)
    for labels in (x_labels, w_labels, y_labels):
        if len(set(labels)) != len(labels):
            _refuse(equation, "a label repeats within one operand")
    xs, ws, ys = set(x_labels), set(w_labels), set(y_labels)
    if xs & ws & ys:
        _refuse(equation, f"label(s) {''.join(sorted(xs & ws & ys))} are in the input, the kernel "
                          f"and the output (a batched weight), which is not one matrix product")
    alone = (xs - ws - ys) | (ws - xs - ys)
    if alone:
        _refuse(equation, f"label(s) {''.join(sorted(alone))} are summed within one operand")
    if ys - xs - ws:
        _refuse(equation, f"output label(s) {''.join(sorted(ys - xs - ws))} come from no operand")
    free = tuple(c for c in x_labels if c in ys)
    contracted = tuple(c for c in w_labels if c in xs)
    produced = tuple(c for c in w_labels if c in ys)
    if not free or free[0] != x_labels[0] or y_labels[0] != x_labels[0]:
        _refuse(equation, "the input's first axis (the batch) must be the output's first axis")
    return EinsumPlan(compact, x_labels, w_labels, y_labels, free, contracted, produced)
