"""Swapped recurrent layers: LSTM, GRU, SimpleRNN, a generic RNN of one of their cells, and
Bidirectional around any of them.

The cells (`SwappedLSTMCell`, `SwappedGRUCell`, `SwappedSimpleRNNCell`, in
graphswap.swap.recurrent_cells) subclass Keras' cells and override only `call`: the input-kernel
and recurrent-kernel products run through `graphswap.swap.ops.swapped_matmul` with TensorFlow's
MatMul gradient (gradients through time are TensorFlow's own).

The layers (`SwappedLSTM`, `SwappedGRU`, `SwappedSimpleRNN`, `SwappedRNN`) are the stock layers
with the swapped cell put in the stock cell's tracking place (weights, their names and order are
the stock layer's), so return_sequences, return_state, go_backwards, stateful, masking, unroll
and initial states are Keras' own RNN loop.  The fused cuDNN path (GPU) is switched off: the
generic loop calls the cell at every step.  `SwappedBidirectional` wraps two swapped layers.

Quantization (8-bit multiplier kernels): each cell holds the state (graphswap/swap/quantstate.py):
the input operand's range (point None) and one range per recurrent operand - "recurrent" for the
state h (every cell) and, for a GRU with reset_after=False, "reset_state" for r * h, the operand
of its third recurrent product.  The output correction (bias compensation) applies per column of
the input product inputs @ kernel (gates x units columns), before the bias; its offset also
carries the recurrent products' mean error, which adds to the same columns (graphswap.swap.
compensation; a GRU with reset_after=True: r * e on its r-gated candidate columns).  Weights
are quantized per product: the full kernel, the full recurrent kernel (a GRU with
reset_after=False: its first 2 x units and last units columns as two products).  The layer
holds the cell's record in its config ("arithmetic", "backward", "quantization",
"output_correction", "intermediate_ranges"), read back through the trust gate.
"""

from __future__ import annotations

import copy

import keras

from graphswap.errors import UnsupportedLayerError
from graphswap.kernels import Kernel, open_record, resolve_kernel
from graphswap.swap.layers import SwappedMixin
from graphswap.swap.recurrent_cells import CELLS, SWAP_KEYS, SWAPPED_CELLS, swapped_cell
from graphswap.swap.tracking import replace_attribute


class _RecurrentStateMixin:
    """A layer whose quantization state sits in its swapped cell(s): `quantized_parts()` names
    them (calibration, compensation and exports reach them there)."""

    def quantized_parts(self) -> dict:
        raise NotImplementedError

    @property
    def quantization(self):
        return next(iter(self.quantized_parts().values())).quantization

    def current_quantization(self, point=None):
        return next(iter(self.quantized_parts().values())).current_quantization(point)

    def part_schemes(self) -> list:
        return [scheme for cell in self.quantized_parts().values()
                for scheme in cell.part_schemes()]


class _SwappedRNNMixin(_RecurrentStateMixin, SwappedMixin):
    """LSTM / GRU / SimpleRNN with the swapped cell in the stock cell's place; the layer's config
    carries the cell's record (module docstring)."""

    lut_grad_supported = True

    def _swap_stock_cell(self, arithmetic, swap_kernel, backward, quantization,
                         output_correction, intermediate_ranges):
        cell = swapped_cell(self.cell, arithmetic, backward, quantization, output_correction,
                            intermediate_ranges, swap_kernel)
        replace_attribute(self, "cell", cell)
        self._adopt_cell()

    def _adopt_cell(self):
        self.arithmetic = self.cell.arithmetic
        self.backward = self.cell.backward
        if hasattr(self, "use_cudnn"):
            self.use_cudnn = False   # the generic loop: the cell runs every step

    def quantized_parts(self) -> dict:
        return {"cell": self.cell}

    def _quantization_config(self) -> dict:
        return self.cell._quantization_config()

    @property
    def output_correction(self):
        return self.cell.output_correction

    def set_output_correction(self, gain=None, offset=None) -> None:
        self.cell.set_output_correction(gain, offset)

    def set_quantization(self, scheme) -> None:
        self.cell.set_quantization(scheme)

    def intermediate_ranges(self) -> dict:
        return self.cell.intermediate_ranges()

    def set_intermediate_range(self, point, lo, hi) -> None:
        self.cell.set_intermediate_range(point, lo, hi)


def _recurrent_init(layer, arithmetic, backward, swap_kernel, quantization, output_correction,
                    intermediate_ranges):
    layer._swap_stock_cell(arithmetic, swap_kernel, backward, quantization, output_correction,
                           intermediate_ranges)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedLSTM(_SwappedRNNMixin, keras.layers.LSTM):
    """LSTM whose cell's kernel products run a graphswap kernel (never the fused cuDNN op)."""

    def __init__(self, units, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, intermediate_ranges=None, **kwargs):
        kwargs.pop("use_cudnn", None)
        super().__init__(units, use_cudnn=False, **kwargs)
        _recurrent_init(self, arithmetic, backward, swap_kernel, quantization, output_correction,
                        intermediate_ranges)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedGRU(_SwappedRNNMixin, keras.layers.GRU):
    """GRU whose cell's kernel products run a graphswap kernel (never the fused cuDNN op)."""

    def __init__(self, units, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, intermediate_ranges=None, **kwargs):
        kwargs.pop("use_cudnn", None)
        super().__init__(units, use_cudnn=False, **kwargs)
        _recurrent_init(self, arithmetic, backward, swap_kernel, quantization, output_correction,
                        intermediate_ranges)


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedSimpleRNN(_SwappedRNNMixin, keras.layers.SimpleRNN):
    """SimpleRNN whose cell's kernel products run a graphswap kernel."""

    def __init__(self, units, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, intermediate_ranges=None, **kwargs):
        super().__init__(units, **kwargs)
        _recurrent_init(self, arithmetic, backward, swap_kernel, quantization, output_correction,
                        intermediate_ranges)

    def get_config(self):
        # SimpleRNN's own config leaves the dropout seed out; a swapped copy keeps its masks
        return {**super().get_config(), "seed": self.cell.seed}


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedRNN(_SwappedRNNMixin, keras.layers.RNN):
    """keras.layers.RNN around a stock LSTMCell / GRUCell / SimpleRNNCell, the cell swapped.
    Its config is RNN's: the cell is saved as the swapped cell, with its record (read back
    through the trust gate by the cell's from_config)."""

    def __init__(self, cell, arithmetic=None, backward="native", swap_kernel=None,
                 quantization=None, output_correction=None, intermediate_ranges=None, **kwargs):
        super().__init__(cell, **kwargs)
        if isinstance(self.cell, SWAPPED_CELLS):
            if arithmetic is not None or swap_kernel is not None:
                raise UnsupportedLayerError(
                    f"layer {self.name!r}: its cell is already swapped; pass arithmetic= only "
                    f"with a stock cell")
            self._adopt_cell()
        else:
            _recurrent_init(self, arithmetic, backward, swap_kernel, quantization,
                            output_correction, intermediate_ranges)

    def get_config(self):
        return keras.layers.RNN.get_config(self)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        # the cell's own from_config passes its record through the trust gate
        return keras.layers.RNN.from_config.__func__(cls, config, custom_objects)


#: stock recurrent layer class -> swapped class
RECURRENT = {keras.layers.LSTM: SwappedLSTM, keras.layers.GRU: SwappedGRU,
             keras.layers.SimpleRNN: SwappedSimpleRNN, keras.layers.RNN: SwappedRNN}
SWAPPED_RECURRENT = tuple(RECURRENT.values())


def recurrent_refusal(layer) -> str | None:
    """Why a stock RNN / Bidirectional layer cannot be swapped (None: it can)."""
    if isinstance(layer, keras.layers.Bidirectional):
        for inner in (layer.forward_layer, layer.backward_layer):
            if type(inner) not in RECURRENT:
                return (f"wraps a {type(inner).__name__}; swappable: LSTM, GRU, SimpleRNN, RNN of "
                        f"their cells")
            reason = recurrent_refusal(inner)
            if reason:
                return reason
        return None
    if type(layer) is keras.layers.RNN and type(layer.cell) not in CELLS:
        return (f"cell {type(layer.cell).__name__} is not swappable (swappable cells: LSTMCell, "
                f"GRUCell, SimpleRNNCell)")
    return None


def swapped_recurrent(layer, arithmetic, backward="native", quantization=None):
    """A swapped copy (unbuilt, same config) of a stock LSTM / GRU / SimpleRNN / RNN /
    Bidirectional layer."""
    reason = recurrent_refusal(layer)
    if reason:
        raise UnsupportedLayerError(f"layer {layer.name!r}: {reason}")
    if isinstance(layer, keras.layers.Bidirectional):
        config = layer.get_config()
        forward = swapped_recurrent(layer.forward_layer, arithmetic, backward, quantization)
        backward_layer = swapped_recurrent(layer.backward_layer, arithmetic, backward,
                                           quantization)
        config.pop("layer")
        config.pop("backward_layer")
        return SwappedBidirectional(forward, backward_layer=backward_layer, **config)
    if type(layer) is keras.layers.RNN:
        config = layer.get_config()
        config.pop("cell")
        cell = swapped_cell(layer.cell, arithmetic, backward, quantization)
        return SwappedRNN(cell, **config)
    config = layer.get_config()
    config.setdefault("seed", layer.cell.seed)   # SimpleRNN's config leaves it out
    return RECURRENT[type(layer)].from_config(
        {**config, "arithmetic": arithmetic, "backward": backward, "quantization": quantization})


@keras.saving.register_keras_serializable(package="graphswap")
class SwappedBidirectional(_RecurrentStateMixin, keras.layers.Bidirectional):
    """Bidirectional around two swapped recurrent layers (its config is Bidirectional's: each
    direction's layer config carries its own record)."""

    lut_grad_supported = True

    def __init__(self, layer, merge_mode="concat", weights=None, backward_layer=None,
                 arithmetic=None, backward="native", quantization=None, **kwargs):
        # stock layers given (a lowered model swapped again): swapped with `arithmetic`
        if type(layer) in RECURRENT:
            layer = swapped_recurrent(layer, resolve_kernel(arithmetic or "exact"), backward,
                                      quantization)
        if type(backward_layer) in RECURRENT:
            backward_layer = swapped_recurrent(backward_layer,
                                               resolve_kernel(arithmetic or "exact"), backward,
                                               quantization)
        super().__init__(layer, merge_mode=merge_mode, weights=weights,
                         backward_layer=backward_layer, **kwargs)
        for inner in (self.forward_layer, self.backward_layer):
            if not isinstance(inner, SWAPPED_RECURRENT):
                raise UnsupportedLayerError(
                    f"layer {self.name!r}: SwappedBidirectional wraps LSTM, GRU, SimpleRNN or RNN "
                    f"layers of their cells; got {type(inner).__name__}")

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """Bidirectional's from_config; an "arithmetic" beside the wrapped layers (which carry
        their own) swaps stock wrapped layers - a record from a file through the trust gate."""
        swap = {key: config[key] for key in ("arithmetic", "backward", "quantization")
                if key in config}
        config = copy.deepcopy({key: value for key, value in config.items() if key not in swap})
        arithmetic = swap.get("arithmetic")
        if arithmetic is not None and not isinstance(arithmetic, Kernel):
            swap["arithmetic"] = open_record(arithmetic, f"layer {config.get('name')!r}")
        for key in ("layer", "backward_layer"):
            if config.get(key) is not None:
                config[key] = keras.saving.deserialize_keras_object(
                    config[key], custom_objects=custom_objects)
        return cls(**config, **swap)

    @property
    def arithmetic(self):
        return self.forward_layer.arithmetic

    @property
    def backward(self):
        return self.forward_layer.backward

    def quantized_parts(self) -> dict:
        return {"forward": self.forward_layer.cell, "backward": self.backward_layer.cell}


#: swapped class -> the stock class it stands for (cells and layers)
STOCK = {**{swapped: stock for stock, swapped in CELLS.items()},
         **{swapped: stock for stock, swapped in RECURRENT.items()},
         SwappedBidirectional: keras.layers.Bidirectional}


def stock_config(layer) -> dict:
    """The config of the stock cell / layer a swapped recurrent cell or layer stands for (the
    swap record left out, nested cells and layers lowered too)."""
    config = {key: value for key, value in layer.get_config().items() if key not in SWAP_KEYS}
    if isinstance(layer, SwappedBidirectional):
        config["layer"] = keras.saving.serialize_keras_object(stock_copy(layer.forward_layer))
        config["backward_layer"] = keras.saving.serialize_keras_object(
            stock_copy(layer.backward_layer))
    elif isinstance(layer, SwappedRNN):
        config["cell"] = keras.saving.serialize_keras_object(stock_copy(layer.cell))
    return config


def stock_copy(layer):
    """An unbuilt stock copy (same config) of a swapped recurrent cell or layer."""
    return STOCK[type(layer)].from_config(stock_config(layer))
