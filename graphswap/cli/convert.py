"""`graphswap convert`: rewrite a model so its layers run a kernel, save it, report."""

from __future__ import annotations

import json

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.help import SectionedCommand
from graphswap.cli.options import (MODEL_OUTPUT_HELP, ModelOutput, force_option, json_option,
                                   layer_types_option, model_loading_options, more_option,
                                   quantization_options, selection_options,
                                   sequence_length_option)
from graphswap.cli.running import load_model, record_named_kernels, rewrite_options, say_recorded
from graphswap.cli.values import BACKWARD_MODES, DEFAULT_SEQUENCE_LENGTH, MAX_CHECK_BATCH


@click.command("convert", cls=SectionedCommand)
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("-o", "--output", type=ModelOutput(),
              help=f"Where to write the rewritten model: {MODEL_OUTPUT_HELP} [default: MODEL's "
                   f"name + .swapped.keras; NAME_swapped_savedmodel/ when MODEL is a graphswap "
                   f"SavedModel directory (NAME: its name without '_savedmodel')].")
@click.option("-k", "--kernel", default=None,
              help="Kernel for every selected layer: 'exact', 'bf16', 'fp32_m{m}', a built-in "
                   "multiplier (see 'graphswap kernels'), a .c/.lut/.bin multiplier file, "
                   "'lib.so:symbol', or an operation-level .so.  [default: exact, or none when "
                   "--kernel-map is given]")
@click.option("--kernel-map", metavar="MAP.json[#INDEX]",
              help='JSON {"layer name or glob": "kernel spec" or null}, e.g. written by '
                   "'graphswap sweep'; or FRONT.json#INDEX, one point of the front "
                   "'graphswap explore' writes.  Overrides --kernel for the layers it names.")
@selection_options("Swap only layers whose name/path matches (repeatable).",
                   "Do not swap layers whose name/path matches (repeatable).")
@layer_types_option("swap")
@click.option("--backward", type=click.Choice(list(BACKWARD_MODES)), default="native",
              show_default=True,
              help="'native': TensorFlow's exact gradients (straight-through); 'kernel': backward "
                   "products through the kernel too; 'lut_grad': the multiplier table's own "
                   "partial derivatives (approximation-aware; Dense and Conv2D).")
@more_option("--check-batch", default=8, show_default=True,
             type=click.IntRange(min=0, max=MAX_CHECK_BATCH),
             help="How many inputs the outputs are compared with the original's on: the first "
                  "calibration examples with --calibrate, else a random batch (0: skip; "
                  f"at most {MAX_CHECK_BATCH}).")
@sequence_length_option("in the random check batch and the MAC count",
                        f"the calibration data's with --calibrate, else {DEFAULT_SEQUENCE_LENGTH}")
@force_option()
@json_option("the report")
@quantization_options
@model_loading_options
@click.pass_context
def convert(ctx, model_path, output, kernel, kernel_map, include, exclude, layer_types, backward,
            check_batch, sequence_length, force, as_json, custom_objects, unsafe, rewrite):
    """Rewrite MODEL so its layers with weights run KERNEL; save it and report.

    MODEL: .keras, full-model .h5, a graphswap SavedModel directory or a Keras 2 SavedModel.
    Swapped by default: every type --layer-types lists (MultiHeadAttention: its projections;
    recurrent layers: their cells' products).  Layers that are
    already swapped get the new kernel when selected and keep theirs otherwise.  The report
    gives, per layer type, the multiply-accumulates per sample that run on the kernel and
    those that stay float.  A subclassed model (class Net(keras.Model)) is converted when
    its class is registered and has get_config (pass its module with --custom-objects).

    With --calibrate DATA the multiplier layers get static activation ranges (saved in the
    model: a prediction no longer depends on its batch); --bias-correction and --recalibrate-bn
    add the zero-gradient-step recovery on the same data (docs/RECOVERY.md).
    """
    source = model_path
    if rewrite["calibrate"] is not None:   # the data is read for the model: load it first
        import_tensorflow_quietly()   # before the API, which imports it
        from graphswap import io
        output = output or io.default_output_path(model_path, "convert")
        io.check_model_output_path(output, force, inputs=[model_path])
        source = load_model(model_path, custom_objects, unsafe)
    options = rewrite_options(rewrite, source if source is not model_path else None, ctx)
    recorded = record_named_kernels([kernel])   # before the work: nothing written if it fails
    import_tensorflow_quietly()   # before the API, which imports it
    from graphswap import io
    result = io.convert(source, kernel, kernel_map=kernel_map, include=list(include) or None,
                        exclude=list(exclude) or None,
                        layer_types=layer_types, backward=backward,
                        check_batch=check_batch, output=output, force=force,
                        custom_objects=custom_objects, safe_mode=not unsafe,
                        rewrite_options=options, sequence_length=sequence_length)
    say_recorded(recorded, err=as_json)
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.format_text())
