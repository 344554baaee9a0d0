"""`graphswap finetune`: train a model with its kernels in the loop and save the result."""

from __future__ import annotations

import json
import sys

import click

from graphswap._quiet_import import import_tensorflow_quietly
from graphswap.cli.help import SectionedCommand
from graphswap.cli.options import (LEARNING_RATE, MODEL_OUTPUT_HELP, ModelOutput, data_option,
                                   data_options, force_option, json_option,
                                   model_loading_options, more_option, task_options)
from graphswap.cli.values import DEFAULT_BATCH_SIZE, DEFAULT_LEARNING_RATE, DEFAULT_SCHEDULE, \
    SCHEDULES
from graphswap.methods import SCHEDULE_REGISTRY


@click.command("finetune", cls=SectionedCommand)
@click.argument("model_path", metavar="MODEL", type=click.Path())
@data_option("train")
@click.option("--val-data", type=click.Path(),
              help="Validation data (.npz: x_test/y_test, else x/y; or an image directory).")
@click.option("--val-split", type=float, default=None,
              help="Hold out this fraction of --data (seeded) for validation instead.")
@click.option("--epochs", default=3, show_default=True, type=click.IntRange(min=0),
              help="Total number of epochs (0: only --recalibrate-bn).")
@click.option("--batch-size", default=DEFAULT_BATCH_SIZE, show_default=True)
@click.option("--lr", "learning_rate", default=DEFAULT_LEARNING_RATE, show_default=True,
              type=LEARNING_RATE,
              help="Adam learning rate (the start of the schedule; 0 to 10), or 'auto': 1e-4 "
                   "when the model's training loss at the start shows it still fits its data, "
                   "3e-4 when it is within 4x the original float model's, else 1e-3.")
@more_option("--schedule", type=click.Choice(list(SCHEDULES)), default=DEFAULT_SCHEDULE,
             help=SCHEDULE_REGISTRY.help("The fine-tuning recipe's learning rate over the run"))
@click.option("--recalibrate-bn/--no-recalibrate-bn", default=None,
              help="Re-estimate BatchNormalization statistics with the approximate forward (no "
                   "gradient steps) before and after training [default: after training, for "
                   "models with BatchNormalization].")
@more_option("--strategy", type=click.Choice(["none", "mirrored", "multiworker"]),
             default="none", show_default=True,
             help="'mirrored': all local GPUs (or logical CPUs); 'multiworker': the cluster in "
                  "TF_CONFIG (run the same command on every worker).")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False),
              help="Write last/best checkpoints and state here after every epoch (graphswap's "
                   "own folder: the model, data and -o must lie outside it).")
@click.option("--resume", is_flag=True,
              help="Continue the run checkpointed in --checkpoint-dir (weights, optimizer, epoch).")
@more_option("--patience", type=int, default=None,
             help="Stop after this many epochs without improvement of the monitor.")
@more_option("--monitor", default=None,
             help="Metric choosing the best epoch [default: val accuracy, else val_loss].")
@more_option("--seed", default=0, show_default=True, help="Seed for weights, shuffling, splits.")
@click.option("--teacher", default=None, metavar="original|MODEL",
              help="Fine-tune by distillation, without labels: reproduce the outputs of "
                   "'original' (the float model MODEL was made from: its swapped layers "
                   "lowered to exact arithmetic) or of another model file, on --data's inputs.")
@more_option("--teacher-weight", type=click.FloatRange(0, 1, min_open=True), default=1.0,
             show_default=True,
             help="With --teacher: the weight of the teacher's outputs in the targets; below 1 "
                  "they are mixed with the labels (W x teacher + (1 - W) x labels).")
@task_options()
@data_options
@click.option("-o", "--output", type=ModelOutput(),
              help=f"Where to write the fine-tuned model: {MODEL_OUTPUT_HELP} [default: MODEL's "
                   f"name + .ft.keras; NAME_ft_savedmodel/ when MODEL is a graphswap SavedModel "
                   f"directory (NAME: its name without '_savedmodel')].")
@force_option("the output (and restart an existing checkpoint directory)")
@json_option()
@model_loading_options
def finetune(model_path, data_path, val_data, val_split, epochs, batch_size, learning_rate,
             schedule, recalibrate_bn, strategy, checkpoint_dir, resume, patience, monitor, seed,
             scale, pad, resize, output, force, as_json, custom_objects, unsafe, loss=None,
             task_metrics=None, teacher=None, teacher_weight=1.0):
    """Fine-tune MODEL (e.g. written by convert) with its kernels in the loop; save the result.

    Uses the loss/metrics saved with the model (else a stated classifier default), keeps the
    best epoch by the validation metric, and saves atomically.  MODEL may be a graphswap
    SavedModel directory (written by 'export --format savedmodel'); the output then is one
    too by default, serving the fine-tuned weights.
    """
    import_tensorflow_quietly()   # before the API, which imports it
    from graphswap import io, research
    if output is None:
        output = io.default_output_path(model_path, "finetune",
                                        directory=io.is_graphswap_saved_model(model_path))
    result = research.finetune(
        model_path, data_path, val_data=val_data, val_split=val_split, epochs=epochs,
        batch_size=batch_size, learning_rate=learning_rate, schedule=schedule,
        recalibrate_bn=recalibrate_bn, strategy=strategy,
        checkpoint_dir=checkpoint_dir, resume=resume, patience=patience, monitor=monitor,
        seed=seed, verbose=2 if as_json or not sys.stdout.isatty() else 1,
        resize=resize, pad=pad, scale=scale, custom_objects=custom_objects,
        safe_mode=not unsafe, force=force, output=output,
        log=None if as_json else (lambda note: click.echo(f"  {note}")), loss=loss,
        metrics=task_metrics, teacher=teacher, teacher_weight=teacher_weight)
    if not result.chief:  # a non-chief worker of a multi-worker run: the chief saves
        click.echo(f"worker done (epochs {result.epochs_run}); the chief writes {output}")
        return
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo(research.format_history(result))
    if result.best_epoch is not None:
        click.echo(f"best epoch {result.best_epoch} by {result.monitor} "
                   f"({result.best_value:.4f}; marked *; the history is of the training run)")
    final = research.format_final(result)
    if final:
        click.echo(final)
    click.echo(f"wrote {output}")
