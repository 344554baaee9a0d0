"""A library of circuits for design-space exploration: the multipliers a hardware designer may
place in each layer, with their hardware figures.

A library is built from sources: directories (every `.c`, `.lut` and `.bin` file in them, sorted),
multiplier files, `lib.so:symbol` specs and built-in multiplier names.  Each circuit's table is
built once (graphswap.kernels caches it); a circuit whose table cannot be built is skipped and
reported with the reason.  Hardware figures come from the file's EvoApproxLib header
(`PDK45_PWR`, `PDK45_AREA`, `PDK45_DELAY`) or from a small table file (CSV or JSON) that names
each circuit (by file name, stem or spec) with `power`, `area` and/or `delay`; the table wins.

The choice "exact" in a layer is the exact 8-bit multiplier of the library's signedness
(mul8u_exact / mul8s_exact): every layer runs in 8 bits on the accelerator, so an exact layer is
an exact multiplier, not float arithmetic.  Its figures are the reference that relative energy is
measured against: given in the table under the name "exact", else EvoApproxLib's exact 8x8
multipliers for power (mul8u_1JFF 0.391 mW, mul8s_1KV6 0.425 mW, as graphswap.research.sweep
uses); area and delay have no default and must be given.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path

from graphswap import multipliers
from graphswap.errors import GraphswapError
from graphswap.input_files import load_json, read_regular
from graphswap.kernels import parse_file_spec, resolve_kernel, resolve_multiplier
from graphswap.research.analysis.sweeping import EXACT_POWER_SIGNED_MW, EXACT_POWER_UNSIGNED_MW

OBJECTIVES = {"power": "PDK45_PWR", "area": "PDK45_AREA", "delay": "PDK45_DELAY"}
UNITS = {"power": "mW", "area": "um2", "delay": "ns"}
CIRCUIT_SUFFIXES = (".c", ".lut", ".bin")
EXACT = "exact"
#: largest metrics table graphswap reads (one row per circuit: kilobytes)
MAX_METRICS_TABLE_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Circuit:
    """One multiplier of the library."""

    name: str             # unique short name (the function / file stem / built-in name)
    spec: str             # canonical kernel spec (absolute path for files)
    signed: bool
    metrics: dict         # {"power": mW, "area": um2, "delay": ns}, None where unknown
    source: str           # where the figures came from
    description: str

    def metric(self, objective: str) -> float | None:
        return self.metrics.get(objective)


@dataclasses.dataclass
class CircuitLibrary:
    circuits: list          # [Circuit], approximate ones (the exact multiplier is separate)
    exact: Circuit          # the exact multiplier of the library's signedness
    skipped: list           # [(source, reason)]

    @property
    def signed(self) -> bool:
        return self.exact.signed

    def names(self) -> list[str]:
        return [c.name for c in self.circuits]

    def by_name(self, name: str) -> Circuit:
        if name == EXACT:
            return self.exact
        for circuit in self.circuits:
            if circuit.name == name:
                return circuit
        raise GraphswapError(f"no circuit named {name!r} in the library ({', '.join(self.names())})")

    def fingerprint(self) -> str:
        """A hash of every circuit's spec and table content: a study belongs to one library."""
        digest = hashlib.sha256()
        for circuit in [self.exact, *self.circuits]:
            digest.update(circuit.spec.encode())
            fp8 = _fp8_kernel(circuit.spec)
            table = fp8.products_table() if fp8 is not None else \
                resolve_multiplier(circuit.spec).table
            digest.update(table.tobytes())
        return digest.hexdigest()

    def require_metric(self, objective: str) -> None:
        if objective not in OBJECTIVES:
            raise GraphswapError(f"unknown objective {objective!r}; allowed: "
                                 f"{', '.join(OBJECTIVES)}")
        missing = [c.name for c in [self.exact, *self.circuits] if c.metric(objective) is None]
        if missing:
            raise GraphswapError(
                f"objective {objective!r} needs the {objective} of every circuit; missing for "
                f"{', '.join(missing)}. Give it in the circuits' headers ({OBJECTIVES[objective]}) "
                f"or in a metrics table (--metrics table.csv with columns name,{objective}; the "
                f"exact multiplier's row is named 'exact')")
        if not self.exact.metric(objective) > 0:
            raise GraphswapError(f"the exact multiplier's {objective} must be > 0, got "
                                 f"{self.exact.metric(objective)}")


def read_metrics_table(path) -> dict:
    """{name: {"power", "area", "delay"}} from a CSV (header name,power,area,delay) or a JSON
    object {name: {...}} file; names are matched against a circuit's name, file name or spec."""
    path = Path(path)
    try:  # a FIFO, a device: refused by what they are, never waited on
        text = read_regular(path, "metrics table", limit=MAX_METRICS_TABLE_BYTES).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GraphswapError(f"the metrics table {path} is not UTF-8 text ({exc.reason} at byte "
                             f"{exc.start}); save it as UTF-8") from None
    rows = {}
    if path.suffix.lower() == ".json":
        try:
            document = load_json(text, f"the metrics table {path}")
        except json.JSONDecodeError as exc:
            raise GraphswapError(f"metrics table {path} is not valid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise GraphswapError(f"metrics table {path} must be a JSON object "
                                 f'{{"name": {{"power": mW, ...}}}}')
        items = document.items()
    else:
        reader = csv.DictReader(text.splitlines())
        if not reader.fieldnames or "name" not in reader.fieldnames:
            raise GraphswapError(f"metrics table {path} needs a header row with a 'name' column "
                                 f"and some of {', '.join(OBJECTIVES)}")
        items = ((row["name"], row) for row in reader)
    for name, row in items:
        if not isinstance(row, dict):
            raise GraphswapError(f"metrics table {path}: entry {name!r} must map to figures")
        figures = {}
        for key in OBJECTIVES:
            value = row.get(key)
            if value in (None, ""):
                continue
            try:
                figures[key] = float(value)
            except (TypeError, ValueError):
                raise GraphswapError(f"metrics table {path}: {name!r} has {key} {value!r}, not a "
                                     f"number") from None
            if not (math.isfinite(figures[key]) and figures[key] >= 0):
                raise GraphswapError(
                    f"metrics table {path}: entry {name!r} has {key} {value!r}; a {key} is a "
                    f"finite number >= 0 ({UNITS[key]}): correct the entry (or leave it empty if "
                    f"the figure is unknown)")
        rows[str(name).strip()] = figures
    return rows


def _expand(sources) -> list[str]:
    specs = []
    for source in sources:
        source = str(source)
        if os.path.isdir(source):
            found = sorted(str(p) for p in Path(source).iterdir()
                           if p.is_file() and p.suffix.lower() in CIRCUIT_SUFFIXES)
            if not found:
                raise GraphswapError(f"library directory {source} holds no multiplier files "
                                     f"({', '.join(CIRCUIT_SUFFIXES)})")
            specs.extend(found)
        else:
            specs.append(source)
    return specs


def _table_figures(table: dict, circuit_name: str, spec: str) -> dict | None:
    file_spec = parse_file_spec(spec)
    keys = [circuit_name, spec]
    if file_spec is not None:
        keys += [os.path.basename(file_spec.path), Path(file_spec.path).stem, file_spec.path]
    for key in keys:
        if key in table:
            return table[key]
    return None


def _fp8_kernel(spec):
    """The FP8 kernel a library entry names ("fp8_e4m3", "fp8_e5m2:FILE"), else None."""
    if not (isinstance(spec, str) and spec.startswith("fp8_")):
        return None
    kernel = resolve_kernel(spec)
    return kernel if getattr(kernel, "fp8_spec", None) is not None else None


def _fp8_library(circuits, skipped, families, table) -> CircuitLibrary:
    """A library of 8-bit float multipliers of one format: its exact choice is the exact FP8
    multiplier of that format; its figures come from the metrics table only (no default)."""
    if len(families) > 1:
        raise GraphswapError(
            f"the library mixes {' and '.join(sorted(f or 'integer' for f in families))} "
            f"circuits; a layer's quantization follows its multiplier's format, so explore one "
            f"family at a time")
    exact_spec = families.pop()
    given = table.get(EXACT) or table.get(exact_spec)
    exact_figures = {"power": None, "area": None, "delay": None, **(given or {})}
    exact = Circuit(EXACT, exact_spec, True, exact_figures,
                    "metrics table" if given else "none", resolve_kernel(exact_spec).description)
    return CircuitLibrary(circuits, exact, skipped)


def load_library(sources, metrics=None) -> CircuitLibrary:
    """The CircuitLibrary of `sources` (directories, files, specs, built-in names), with figures
    from the headers and the optional metrics table (`metrics`: a path, or a dict as
    read_metrics_table returns).  Raises GraphswapError for an empty library or one that mixes
    signed and unsigned circuits (explore one family at a time)."""
    specs = _expand(sources if isinstance(sources, (list, tuple)) else [sources])
    if not specs:
        raise GraphswapError("the circuit library is empty: give a directory of multiplier files, "
                             "files, 'lib.so:symbol' specs or built-in names")
    table = read_metrics_table(metrics) if isinstance(metrics, (str, os.PathLike)) else \
        dict(metrics or {})
    circuits, skipped, names, families = [], [], set(), set()
    for spec in specs:
        try:
            fp8 = _fp8_kernel(spec)   # an 8-bit float multiplier (graphswap/kernels/fp8.py)
            multiplier = fp8 if fp8 is not None else resolve_multiplier(spec)
            if multiplier is None:
                raise GraphswapError(f"{spec} is not a multiplier (a library holds 8-bit "
                                     f"multipliers: .c, .lut, .bin, lib.so:symbol, built-ins)")
            resolve_kernel(multiplier.spec)  # the table is built (and cached) here, once
        except GraphswapError as exc:
            skipped.append((spec, str(exc).splitlines()[0]))
            continue
        name = multiplier.name
        if name in names or name == EXACT:
            name = f"{name}@{len(circuits)}"
        names.add(name)
        header = {objective: multiplier.header_metrics.get(key)
                  for objective, key in OBJECTIVES.items()}
        given = _table_figures(table, multiplier.name, multiplier.spec)
        figures = {**header, **(given or {})}
        source = "metrics table" if given else ("file header" if any(
            v is not None for v in header.values()) else "none")
        circuits.append(Circuit(name, multiplier.spec, multiplier.signed, figures, source,
                                multiplier.description))
        families.add(fp8.exact_products().spec if fp8 is not None else None)
    if not circuits:
        reasons = "; ".join(f"{spec}: {reason}" for spec, reason in skipped)
        raise GraphswapError(f"no usable circuit in the library ({reasons})")
    if families != {None}:
        return _fp8_library(circuits, skipped, families, table)
    signedness = {c.signed for c in circuits}
    if len(signedness) > 1:
        signed = [c.name for c in circuits if c.signed]
        raise GraphswapError(
            f"the library mixes signed ({', '.join(signed)}) and unsigned circuits; a layer's "
            f"quantization follows its multiplier's signedness, so explore one family at a time")
    signed = signedness.pop()
    exact_spec = "mul8s_exact" if signed else "mul8u_exact"
    exact_figures = {"power": EXACT_POWER_SIGNED_MW if signed else EXACT_POWER_UNSIGNED_MW,
                     "area": None, "delay": None}
    given = table.get(EXACT) or table.get(exact_spec)
    exact_figures.update(given or {})
    exact = Circuit(EXACT, exact_spec, signed, exact_figures,
                    "metrics table" if given else "EvoApproxLib mul8s_1KV6 / mul8u_1JFF power",
                    multipliers.builtin_multipliers()[exact_spec])
    return CircuitLibrary(circuits, exact, skipped)
