"""What several commands do around their API call: the quantization options turned into the
API's rewrite options (rewrite_options), the kernel files named on the command line recorded in
the trust store (record_named_kernels, say_recorded), a model loaded, notes printed.
"""

from __future__ import annotations

import os

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.values import (CHECK_SAMPLES, DEFAULT_COMPENSATION, DEFAULT_RECIPE,
                                  DEFAULT_WEIGHT_TUNING)
from graphswap.errors import GraphswapError, OutputPathError, TrustStoreError


def record_named_kernels(specs, written=None) -> list:
    """A kernel file named on the command line is the user's approval: record it in the trust
    store, so later commands need no --trust-kernel.  Called before the command's work, so a
    store that cannot be written (a full disk under the config folder) stops the command before
    it writes anything; a spec graphswap refuses to record is tried again after the work
    (say_recorded), where its error is said as before.  `written`: what the command already
    wrote (it records only after its work).  Returns the contents newly recorded and the specs
    to try again."""
    from graphswap import kernels
    from graphswap.kernels import trust as trust_store
    recorded = []
    for spec in specs:
        if spec is None:
            continue
        try:
            remembered, reason = kernels.remember_named_file(spec), None
        except TrustStoreError as exc:   # a store that cannot be written: stop before the work
            if exc.reason is None:
                raise   # a lock or store file that is not a plain file: said as it is
            reason = exc.reason
        except GraphswapError:
            if written is not None:
                raise
            recorded.append(spec)
            continue
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if reason is not None:
            done = (f"{written} was written, but later commands will need --trust-kernel {spec} "
                    f"(or 'graphswap trust add {spec}' once the store can be written)"
                    if written is not None else "nothing was written")
            raise OutputPathError(
                f"recording the kernel file {spec} in the trust store {trust_store.store_path()} "
                f"failed: {reason}; graphswap records the kernel files you name there so that "
                f"later commands need no --trust-kernel. Free some space there (or set "
                f"GRAPHSWAP_CONFIG_DIR to a writable folder) and run the command again; "
                f"{done}") from None
        if remembered is not None and remembered[1]:
            recorded.append(remembered[0])
    return recorded


def say_recorded(recorded, err: bool = False, written="the output") -> None:
    """One line for each kernel file newly recorded in the trust store, with how to undo it (a
    spec record_named_kernels left for after the work is recorded now)."""
    for item in filter(None, recorded):
        for content in (record_named_kernels([item], written) if isinstance(item, str)
                        else [item]):
            click.echo(f"trusted {content.path} (sha256 {content.sha256[:16]}...) for later "
                       f"graphswap commands; undo with: graphswap trust remove {content.path}",
                       err=err)



def rewrite_options(rewrite: dict, model=None, ctx=None) -> dict:
    """rewrite_model's keyword arguments from the quantization options (calibration data read
    for `model` when given, else passed on as a path)."""
    explicit = {k: rewrite[k] for k in ("weights", "weight_granularity") if rewrite[k]}
    if rewrite["quantization"] == "tfapprox" and explicit:
        raise click.UsageError("--quantization tfapprox fixes the weight encoding and "
                               "granularity; drop --weights/--weight-granularity, or use them "
                               "without the preset")
    if rewrite["calibrate"] is None:
        needing = [f"--{name.replace('_', '-')}" for name in ("bias_correction", "calibration_bn",
                                                               "weight_tuning")
                   if rewrite[name] and rewrite[name] != "none"]
        needing += ["--operands auto"] if rewrite["operands"] == "auto" else []
        needing += ["--dynamic-fallback"] if rewrite["dynamic_fallback"] else []
        if ctx is not None:
            needing += [f"--{name.replace('_', '-')}"
                        for name in ("calibration_samples", "calibration_method",
                                     "calibration_source")
                        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if needing:
            raise click.UsageError(f"{', '.join(needing)} "
                                   f"{'needs' if len(needing) == 1 else 'need'} --calibrate DATA")
    quantization = rewrite["quantization"]
    if quantization != "tfapprox":
        quantization = {"weights": (rewrite["weights"] or "").replace("-", "_") or None,
                        "granularity": (rewrite["weight_granularity"] or "per-channel")
                        .replace("-", "_"),
                        "observer": rewrite["observer"].replace("-", "_"),
                        "momentum": rewrite["observer_momentum"]}
    options = {"quantization": quantization, "fold_batchnorm": rewrite["fold_batchnorm"]}
    if rewrite["operands"] is not None:
        options["operands"] = rewrite["operands"].replace("-", "_")
    if rewrite["calibrate"] is not None:
        data = rewrite["calibrate"]
        if model is not None:
            import_tensorflow_quietly()   # before the API, which imports it
            from graphswap import research
            # the examples beyond those calibrated on are the zero-step check's (swap.fallback)
            data = research.calibration_arrays(data, model, rewrite["calibration_samples"]
                                               + CHECK_SAMPLES)
        options.update(calibration_data=data,
                       calibration_samples=rewrite["calibration_samples"],
                       calibration_method=rewrite["calibration_method"],
                       calibration_source=rewrite["calibration_source"],
                       bias_correction=default_recipe(rewrite)[0],
                       recalibrate_bn=(DEFAULT_RECIPE if rewrite["calibration_bn"] is None
                                       else rewrite["calibration_bn"]))
        if rewrite["weight_tuning"] is not None:   # else measured, with and without
            options["weight_tuning"] = bool(rewrite["weight_tuning"])
        if rewrite["dynamic_fallback"] is not None:
            options["dynamic_fallback"] = rewrite["dynamic_fallback"]
    return options


def default_recipe(rewrite: dict) -> tuple:
    """(bias_correction, weight_tuning) with --calibrate: the options as given, the best measured
    recipe (DEFAULT_COMPENSATION, DEFAULT_WEIGHT_TUNING) where not given; 'none' is None."""
    bias = rewrite["bias_correction"]
    bias = DEFAULT_COMPENSATION if bias is None else (None if bias == "none" else bias)
    tuning = rewrite["weight_tuning"]
    return bias, DEFAULT_WEIGHT_TUNING if tuning is None else bool(tuning)


def load_model(path, custom_objects=None, unsafe=False):
    import_tensorflow_quietly()   # before the API, which imports it
    from graphswap import io
    return io.load_model(path, custom_objects=custom_objects, safe_mode=not unsafe)


def echo_notes(notes, err=False):
    for note in notes:
        click.echo(f"  {note}", err=err)
