"""Jobs of few rows (a recurrent step, a small batch) on the avx2 path gather their products from
the table rows (native_kernels/src/lut_gather_avx2.c) instead of expanding the weights: the same
exact integer sums as the numpy reference on every path, on both sides of the row threshold
(GS_LUT_GATHER_ROWS = 32), with column counts that leave a tail of fewer than 8 and reductions
that flush the int32 runs."""

from __future__ import annotations

import numpy as np
import pytest

from graphswap.native import conv_geometry
from test_kernels_quantized import exact_u8_table, numpy_lut_conv, numpy_lut_matmul, random_table

RNG = np.random.default_rng(20261207)

# rows 1..32 take the gathers on the avx2 path, 33 and 64 the expanded weights
SHAPES = [(1, 1, 1), (1, 64, 256), (5, 7, 3), (16, 33, 70), (31, 300, 13), (32, 64, 256),
          (32, 9, 64), (33, 64, 256), (64, 20, 129)]
TABLES = {"exact u8 (16-bit span)": exact_u8_table,
          "signed 2^16": lambda: random_table(2 ** 16),
          "2^27 entries (an int32 flush every 16 terms)": lambda: random_table(2 ** 27)}


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("table_name", list(TABLES))
def test_few_rows_give_the_reference_sums_on_every_path(each_isa, m, k, n, table_name):
    table = TABLES[table_name]()
    a = RNG.integers(0, 256, (m, k), dtype=np.uint8)
    b = RNG.integers(0, 256, (k, n), dtype=np.uint8)
    expected = numpy_lut_matmul(a, b, table)
    each_isa.set_table_factoring(False)
    for isa in each_isa.supported_isas:
        each_isa.set_isa(isa)
        np.testing.assert_array_equal(each_isa.lut_matmul(a, b, table), expected, err_msg=isa)


def test_a_convolution_of_few_output_pixels_on_every_path(each_isa):
    """A 4x4 output (16 rows) of 24 channels: the convolution's jobs take the same kernel."""
    g = conv_geometry((1, 6, 6, 5), (3, 3, 5, 24), (1, 1), (1, 1), "valid", 1)
    x = RNG.integers(0, 256, (1, 6, 6, 5), dtype=np.uint8)
    w = RNG.integers(0, 256, (3, 3, 5, 24), dtype=np.uint8)
    table = random_table(2 ** 20)
    expected, _ = numpy_lut_conv(x, w, table, 0, g)
    each_isa.set_table_factoring(False)
    for isa in each_isa.supported_isas:
        each_isa.set_isa(isa)
        acc, _ = each_isa.lut_conv2d(x, w, table, 0, g, window_sums=True)
        np.testing.assert_array_equal(acc, expected, err_msg=isa)
