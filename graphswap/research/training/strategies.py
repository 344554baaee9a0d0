"""Distribution strategies for fine-tuning: none, "mirrored" (local GPUs, or logical CPUs), and
"multiworker" (the cluster in TF_CONFIG; worker 0 is the chief and writes files), with the
workaround Keras 3 needs to train under MultiWorkerMirroredStrategy."""

from __future__ import annotations

import json
import os
import types

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer

from graphswap.errors import GraphswapError

STRATEGIES = ("none", "mirrored", "multiworker")


def resolve_strategy(strategy):
    """A tf.distribute.Strategy from None/"none"/"mirrored"/"multiworker" or a Strategy."""
    if strategy is None or strategy == "none":
        return tf.distribute.get_strategy()
    if isinstance(strategy, tf.distribute.Strategy):
        return strategy
    if strategy == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            return tf.distribute.MirroredStrategy()
        cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices=cpus)
    if strategy == "multiworker":
        raw = os.environ.get("TF_CONFIG")
        if not raw:
            raise GraphswapError(
                "strategy 'multiworker' needs the TF_CONFIG environment variable on every worker, "
                'e.g. TF_CONFIG=\'{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
                '"task": {"type": "worker", "index": 0}}\' (index 1 on the second machine); '
                "see docs/WALKTHROUGH.md")
        try:
            config = json.loads(raw)
            workers = config["cluster"]["worker"]
            index = int(config["task"]["index"])
        except (ValueError, KeyError, TypeError) as exc:
            raise GraphswapError(
                f"TF_CONFIG is not a valid cluster description ({type(exc).__name__}: {exc}); "
                f'expected {{"cluster": {{"worker": ["host:port", ...]}}, "task": {{"type": '
                f'"worker", "index": N}}}}') from None
        if not 0 <= index < len(workers):
            raise GraphswapError(f"TF_CONFIG task index {index} is outside the {len(workers)} "
                                 f"workers listed in cluster.worker")
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise GraphswapError(f"unknown strategy {strategy!r}; allowed: {', '.join(STRATEGIES)} or a "
                         f"tf.distribute.Strategy")


def is_chief(strategy) -> bool:
    """True unless this process is a non-chief worker of a multi-worker strategy."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "cluster_spec", None):
        return True
    spec = resolver.cluster_spec().as_dict()
    if not spec:
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type == "chief":
        return True
    return "chief" not in spec and task_type == "worker" and task_id == 0


def patch_multiworker_build(model) -> None:
    """Work around two failures of Keras 3's fit() under MultiWorkerMirroredStrategy
    (keras-team/keras#20585, tensorflow/tensorflow#72388: "Keras 3 + MWMS does not train").

    1. `_maybe_symbolic_build` takes the first distributed batch and calls
       strategy.reduce("MEAN", batch) on it only to learn its shapes; under MWMS that reduce fails
       ("Attempt to convert a value (PerReplica...)").  The build needs shapes and dtypes only,
       which this replica's local batch has, so this model builds from it instead.
    2. `reduce_per_replica` averages each step's logs across workers with
       strategy.reduce("MEAN", v, axis=0), which fails for the scalar losses and metrics
       ("Invalid reduction dimension 0 for input with 0 dimensions").  The module function is
       wrapped so that, on the multi-worker path only, scalars are reduced with axis=None (the
       cross-worker mean Keras intends); every other path calls Keras' own function unchanged.
    """
    if not getattr(tf_trainer.reduce_per_replica, "_graphswap_patched", False):
        keras_reduce = tf_trainer.reduce_per_replica

        def reduce_per_replica(values, strategy, reduction):
            if reduction in ("auto", "mean") and \
                    tf_trainer._collective_all_reduce_multi_worker(strategy):
                def reduce(value):
                    local = strategy.experimental_local_results(value)[0] \
                        if isinstance(value, tf.distribute.DistributedValues) else value
                    rank = getattr(local.shape, "rank", None)
                    return strategy.reduce("MEAN", value, axis=0 if rank else None)

                return keras.tree.map_structure(reduce, values)
            return keras_reduce(values, strategy, reduction)

        reduce_per_replica._graphswap_patched = True
        tf_trainer.reduce_per_replica = reduce_per_replica

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        if iterator is not None:
            for _, _, batches in iterator:
                batch = next(batches)
                data_batch = keras.tree.map_structure(
                    lambda value: (self.distribute_strategy.experimental_local_results(value)[0]
                                   if isinstance(value, tf.distribute.DistributedValues)
                                   else value), batch)
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = types.MethodType(maybe_symbolic_build, model)
