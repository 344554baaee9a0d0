"""`graphswap saliency`: a saliency map of a model for one input, written as a PNG."""

from __future__ import annotations

from pathlib import Path

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.help import SectionedCommand
from graphswap.cli.options import OutputFile, force_option, model_loading_options
from graphswap.cli.running import load_model


@click.command("saliency", cls=SectionedCommand)
@click.argument("model_path", metavar="MODEL", type=click.Path())
@click.argument("image_path", metavar="IMAGE", type=click.Path())
@click.option("-o", "--output", required=True, type=OutputFile((".png",)),
              help="PNG to write: the input and its saliency heat map side by side.")
@click.option("--class", "class_index", type=int, default=None,
              help="Class whose score is differentiated [default: the predicted class].")
@click.option("--method", type=click.Choice(["guided", "vanilla"]), default="guided",
              show_default=True,
              help="'guided': guided backprop (ReLUs pass positive gradients of active units); "
                   "'vanilla': the plain gradient of the class score.")
@click.option("--index", type=int, default=None,
              help="Sample to use when IMAGE is an .npz archive.")
@click.option("--key", default=None,
              help="Array of the .npz to take the sample from [default: x_test, x, images or "
                   "x_train, whichever is present].")
@force_option()
@model_loading_options
def saliency(model_path, image_path, output, class_index, method, index, key, force,
             custom_objects, unsafe):
    """Saliency map of MODEL for IMAGE (a PNG/JPEG, or an .npz with --index), written as a PNG.

    An image file is converted to the model's channels and resized to its input size.
    """
    import_tensorflow_quietly()   # before the API, which imports it
    from graphswap import io, research
    io.check_output_path(output, force, inputs=[model_path, image_path])
    model = load_model(model_path, custom_objects, unsafe)
    image, label, notes = research.load_sample(model, image_path, index=index, key=key)
    for note in notes:
        click.echo(note)
    result = research.saliency_map(model, image, class_index=class_index, method=method)
    probability = float(result.probabilities[result.class_index])
    click.echo(f"predicted class {result.predicted}"
               + (f" (label {label})" if label is not None else "")
               + f"; {method} saliency of class {result.class_index} (p={probability:.3f}, "
                 f"gradient of its {result.score})")
    research.write_saliency_png(result, output, force=force,
                                title=f"{Path(model_path).name}: {Path(image_path).name}"
                                      + (f"[{index}]" if index is not None else ""))
    click.echo(f"wrote {output}")
