"""Reading models that are not Keras 3 archives (Keras 2 SavedModel directories)."""

from __future__ import annotations

from graphswap.errors import ModelLoadError


def load_keras2_saved_model(path, custom_objects=None):
    raise ModelLoadError(
        f"{path} is a SavedModel directory; reading Keras 2 SavedModels is not supported yet. "
        f"Load it with tf_keras and save it as a full-model .h5 (model.save('model.h5')), then "
        f"convert that")
