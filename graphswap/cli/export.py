"""`graphswap export`: a model written as ONNX or as a graphswap SavedModel, verified first."""

from __future__ import annotations

import json

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.help import SectionedCommand
from graphswap.cli.options import (force_option, json_option, model_loading_options,
                                   more_option, sequence_length_option)
from graphswap.cli.running import load_model
from graphswap.cli.values import DEFAULT_SEQUENCE_LENGTH, MAX_CHECK_BATCH


@click.command("export", cls=SectionedCommand)
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.option("--format", "export_format", type=click.Choice(["onnx", "savedmodel"]),
              default="onnx", show_default=True, help="What to write.")
@click.option("--keep-kernels", is_flag=True,
              help="ONNX only: keep the swapped layers' C kernels as custom nodes "
                   "(ai.onnx.contrib GraphswapMatMul/GraphswapConv2D) that onnxruntime runs "
                   "through onnxruntime-extensions; open with graphswap.onnx_ops.session(path).")
@click.option("-o", "--output", type=click.Path(),
              help="Output file (onnx) or directory (savedmodel) [default: MODEL's name + .onnx, "
                   ".kept.onnx or _savedmodel].")
@more_option("--opset", default=17, show_default=True, help="ONNX opset.")
@more_option("--check-batch", default=8, show_default=True,
             type=click.IntRange(min=1, max=MAX_CHECK_BATCH),
             help="Size of the random batch the export is verified on (1 to "
                  f"{MAX_CHECK_BATCH}).")
@sequence_length_option("in the random batch the export is verified on")
@force_option()
@json_option()
@model_loading_options
def export_command(model_path, export_format, keep_kernels, output, opset, check_batch,
                   sequence_length, force, as_json, custom_objects, unsafe):
    """Export MODEL (.keras, .h5, SavedModel directory) to ONNX or a graphswap SavedModel.

    \b
    onnx (default): swapped layers lowered to standard MatMul/Conv with the fine-tuned
      weights, i.e. the model with the EXACT kernel; the kernel each layer was trained
      for is recorded in metadata_props["graphswap"] (JSON).
    onnx --keep-kernels: swapped products become custom nodes running the same C
      kernels in onnxruntime (needs graphswap + onnxruntime-extensions to run).
    savedmodel: serving_default signature with named inputs/outputs; only standard
      TensorFlow ops, so it serves without graphswap (TF Serving, a fresh Python).
      The approximate arithmetic does NOT run in it (a tf.numpy_function body is not
      serialized): swapped layers run as exact float32 MatMul/Conv2D.  Kernel metadata
      is in assets/graphswap_kernels.json.  --keep-kernels is refused, and so is any
      model that would still contain Python ops.  The directory also holds the
      rewritten model itself (assets/graphswap/model.keras + manifest.json), so every
      graphswap command reopens it: finetune, evaluate, convert, export, ...

    Every export is run on a sample batch and compared with the Keras model before it
    is written (see docs/EXPORT.md).
    """
    if keep_kernels and export_format != "onnx":
        raise click.UsageError(
            "--keep-kernels needs --format onnx: a SavedModel cannot hold the C kernels (a "
            "tf.numpy_function body is not serialized), so it could not serve")
    import_tensorflow_quietly()   # before the API, which imports it
    from graphswap import io, swap
    if output is None:
        kind = export_format if export_format == "savedmodel" else (
            "onnx-kept-kernels" if keep_kernels else "onnx")
        output = io.default_output_path(model_path, kind)
    io.check_output_path(output, force, inputs=[model_path])
    model = load_model(model_path, custom_objects, unsafe)
    result = io.export_model(model, output, format=export_format, keep_kernels=keep_kernels,
                             opset=opset, force=force, check_batch=check_batch,
                             sequence_length=sequence_length)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    for layer in result.layers:
        nodes = f" -> {', '.join(layer.onnx_nodes)}" if layer.onnx_nodes else ""
        click.echo(f"{layer.path:<24} {layer.layer_type:<7} kernel {layer.kernel.get('spec')}"
                   f"{nodes}")
    click.echo(f"{len(result.layers)} swapped layer(s); inputs {result.inputs}, outputs "
               f"{result.outputs}")
    free = f" (free dimensions at length {sequence_length or DEFAULT_SEQUENCE_LENGTH})" \
        if swap.has_free_dimensions(model) else ""
    click.echo(f"verified against the {result.reference}: max |difference| "
               f"{result.max_abs_difference:.3g} on a batch of {check_batch}{free}")
    what = result.format
    if result.format == "savedmodel":
        what += ": serves without graphswap; graphswap commands reopen it"
    click.echo(f"wrote {result.path} ({what})")
