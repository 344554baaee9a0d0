"""Backward-only surgery, the public face: keep a computation's forward pass, change its gradient.

    from graphswap import gradients as gg
    y = gg.scale(x, 5.0)                     # forward identity, backward dy * 5
    y = gg.clip_by_value(x, -0.1, 0.1)       # forward identity, backward clipped to [-0.1, 0.1]
    y = gg.clip_by_norm(x, 1.0)              # forward identity, backward's L2 norm <= 1
    y = gg.reverse(x, 1.0)                   # forward identity, backward -1.0 * dy
    y = gg.guided_relu(x)                    # forward relu, backward (dy > 0) * (x > 0) * dy
    y = gg.straight_through(f, b)(x)         # forward f(x) (run once), backward that of b at x
    y = gg.with_gradient(np_fn, grad_fn)(x)  # numpy/ctypes forward, numpy gradient
    model2 = gg.override(model, {"relu": "guided", "fc1": gg.ClipByNorm(1.0)})

The implementation lives in graphswap.surgery (primitives, layers, rules, wrapper, override); this
module only gathers it under the documented name.
"""

from graphswap.surgery import *  # noqa: F401,F403 - the documented face of graphswap.surgery
from graphswap.surgery import __all__  # noqa: F401
