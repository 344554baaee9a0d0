"""Exception types.  Every error graphswap raises on bad input derives from GraphswapError, so the
CLI can print its message (what was wrong, what is allowed, what to do) without a traceback."""


class GraphswapError(Exception):
    """Base class of all errors graphswap raises deliberately."""


class KernelSpecError(GraphswapError, ValueError):
    """A kernel specification (name, .c/.so/.lut path, symbol) is invalid or cannot be resolved."""


class KernelLoadError(GraphswapError):
    """A kernel library could not be loaded: missing file, missing symbols, ABI version mismatch."""


class KernelTrustError(KernelLoadError):
    """A model names a native library the user has not trusted, or whose hash changed."""


class MultiplierRangeError(KernelSpecError):
    """A multiplier returns values that are not 8x8-bit products (outside the 16-bit range of its
    signedness, or truncated by its declared type); the message names the operands."""


class KernelCrashError(GraphswapError):
    """A user's kernel crashed (a signal) or hung while graphswap ran it in a child process; the
    message names the signal and the stage."""


class KernelExecutionError(GraphswapError, RuntimeError):
    """A kernel call returned an error code; the message carries the kernel's own message."""


class UnsupportedLayerError(GraphswapError, ValueError):
    """A layer uses an option graphswap cannot reproduce; the message names the layer and option."""


class ShapeError(GraphswapError, ValueError):
    """Operand shapes or a convolution geometry that do not fit together."""


class InputFileError(GraphswapError):
    """An input file graphswap cannot read as what it should be: not a regular file (a FIFO, a
    socket, a device, a directory), missing, or JSON nested deeper than graphswap reads
    (graphswap.input_files)."""


class ModelLoadError(GraphswapError):
    """A model file could not be loaded (missing, corrupt, weights-only, unsupported format)."""


class DataError(GraphswapError, ValueError):
    """Training/evaluation data does not fit the model (keys, shapes, labels, emptiness)."""


class OutputPathError(GraphswapError):
    """An output path exists (and --force was not given), or its directory is missing/read-only."""


class CheckpointError(GraphswapError):
    """A fine-tuning checkpoint that cannot be resumed: it belongs to another run (another model,
    other data or settings), or it is inconsistent."""


class ExportError(GraphswapError):
    """A model cannot be exported in the requested form, or the export failed its verification."""


class UnknownRuleError(GraphswapError, ValueError):
    """A gradient rule name or config that graphswap does not know."""


class RuleMatchError(GraphswapError, ValueError):
    """An override rule that matched no layer (with strict=True), or cannot reach a layer."""


class CustomGradientError(GraphswapError, ValueError):
    """A user forward/gradient function returned something of the wrong shape or type."""


class SavedModelConsistencyError(ModelLoadError):
    """A graphswap SavedModel whose halves disagree: the serving graph, the embedded Keras model and
    the manifest tying them together (one of them was replaced or edited)."""


class QuantizationError(GraphswapError, ValueError):
    """A quantization scheme, calibration or recovery request that is malformed or does not fit
    the model/multiplier (unknown method, wrong-shaped or too little calibration data, ...)."""


class CacheSecurityError(KernelTrustError):
    """graphswap's per-user cache (compiled code it loads) is not private to the user: a folder on
    its path belongs to another user, is writable by others, or is a symbolic link."""


class TrustStoreError(KernelTrustError):
    """graphswap's per-user trust store cannot be written (a full disk or a read-only folder under
    the config folder; `reason` is the system's word for it, e.g. "No space left on device"), or
    its file or lock file is not a plain file graphswap made (a symbolic link, a FIFO, a folder:
    `reason` is None).  The store is left as it was."""

    def __init__(self, message: str, reason: "str | None" = None):
        super().__init__(message)
        self.reason = reason


class TrainingDivergedError(GraphswapError):
    """Fine-tuning produced a non-finite training loss or non-finite weights (NaN or infinite),
    or was given a model whose weights already were: the run stops and writes no model."""
