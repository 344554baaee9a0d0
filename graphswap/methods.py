"""The methods a user chooses by name - calibration methods, bias compensation methods, the
fine-tuning recipe's learning-rate schedules - described once, without TensorFlow: each one's
name, the line --help shows for it and whether it is the default.

    CALIBRATION_REGISTRY    graphswap.swap.calibration: calibrate(method=), --calibration-method
    COMPENSATION_REGISTRY   graphswap.swap.compensation: compensate_bias(method=),
                            --bias-correction ("none", the command line's off switch, is no method)
    SCHEDULE_REGISTRY       graphswap.research: make_optimizer(schedule=), finetune --schedule

A Registry is what is offered: the API's tuples of names (swap.CALIBRATION_METHODS, ...), its
defaults and the command line's choices and help texts are read from it (the command line imports
this module without TensorFlow).  The code that does the work registers one function per name
with an Implementations table of the registry (`@range_method("minmax")` in
graphswap/swap/calibration.py); registering a name the registry does not describe fails at import,
and tests/test_architecture.py::test_every_described_method_is_implemented fails when a described
method has no function.  Imports nothing but the standard library and graphswap.errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping

from graphswap.errors import GraphswapError, QuantizationError


@dataclasses.dataclass(frozen=True)
class Method:
    """One named method: `summary` is the line --help shows after its name."""

    name: str
    summary: str
    default: bool = False


class Registry:
    """The methods of one `kind` ("calibration method"), in the order --help lists them; at most
    one is the default.  Looking up a name it does not hold raises `error` (a GraphswapError
    class) naming what is allowed."""

    def __init__(self, kind: str, methods: Iterable[Method],
                 error: type[GraphswapError] = GraphswapError):
        self.kind = kind
        self.methods = tuple(methods)
        self.error = error
        self.names = tuple(method.name for method in self.methods)
        if len(set(self.names)) != len(self.names):
            raise GraphswapError(f"{kind}: a name is described twice in {self.names}")
        defaults = [method.name for method in self.methods if method.default]
        if len(defaults) > 1:
            raise GraphswapError(f"{kind}: more than one default ({', '.join(defaults)})")
        self.default = defaults[0] if defaults else None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name) -> bool:
        return name in self.names

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names})"

    def get(self, name) -> Method:
        """The Method called `name`; raises self.error naming the allowed names."""
        for method in self.methods:
            if method.name == name:
                return method
        raise self.error(f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names)}")

    def check(self, name) -> str:
        """`name` if the registry holds it; raises self.error naming the allowed names."""
        return self.get(name).name

    def help(self, lead: str, extra: Iterable[tuple[str, str]] = (), when: str = "") -> str:
        """--help's text: `lead`, then each name with its summary - the default marked
        "(default`when`)" -, then the `extra` (name, summary) choices the command line adds (an
        off switch)."""
        entries = [f"'{method.name}'{f' (default{when})' if method.default else ''}: "
                   f"{method.summary}" for method in self.methods]
        entries += [f"'{name}': {summary}" for name, summary in extra]
        return f"{lead}: {'; '.join(entries)}."


class Implementations(Mapping):
    """The functions that implement a registry's methods, one per name, registered by the module
    that does the work: `register(name)` is the decorator; `table[name]` looks one up (a name the
    registry does not hold raises its error)."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self._functions: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[Callable], Callable]:
        self.registry.check(name)
        if name in self._functions:
            raise GraphswapError(f"{self.registry.kind} {name!r} is implemented twice")

        def decorator(function: Callable) -> Callable:
            self._functions[name] = function
            return function

        return decorator

    def __getitem__(self, name: str) -> Callable:
        self.registry.check(name)
        try:
            return self._functions[name]
        except KeyError:
            raise GraphswapError(f"{self.registry.kind} {name!r} is described but has no "
                                 f"implementation") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._functions)

    def __len__(self) -> int:
        return len(self._functions)


CALIBRATION_REGISTRY = Registry("calibration method", [
    Method("minmax", "the observed minimum and maximum"),
    Method("percentile", "the 99.99th percentile (of |x| for a symmetric layer)"),
    Method("mse", "the clipping range of least quantization error"),
    Method("entropy", "the clipping range of least KL divergence (TensorRT's entropy "
                      "calibrator)"),
    Method("output", "the percentile range, narrowed where the layer's output through the "
                     "multiplier errs less (measured best: docs/RECOVERY.md)", default=True),
], error=QuantizationError)

COMPENSATION_REGISTRY = Registry("bias compensation method", [
    Method("mean", "the approximate products' mean error removed"),
    Method("moments", "their mean and spread matched to the exact products' (measured best: "
                      "docs/RECOVERY.md)", default=True),
], error=QuantizationError)

SCHEDULE_REGISTRY = Registry("learning-rate schedule", [
    Method("constant", "the learning rate throughout"),
    Method("cosine", "decayed to 0 by a cosine over the run (measured best: docs/RECOVERY.md)",
           default=True),
])

#: every registry, for the tests that hold the implementations and the command line to them
REGISTRIES = (CALIBRATION_REGISTRY, COMPENSATION_REGISTRY, SCHEDULE_REGISTRY)
