"""Where the README has always named it: the tensor store's Python API,
``mldbg.tensors.debug_save`` ... and ``mldbg.tensors.TensorStoreFull``.

The code lives in :mod:`mldbg.store.tensors`; ``mldbg.debug_save`` and the others are the
usual spelling.
"""

from .store.tensors import (
    TensorStoreFull,
    debug_clear,
    debug_load,
    debug_save,
    debug_show_all,
    tensor_home,
)

__all__ = [
    "TensorStoreFull",
    "debug_clear",
    "debug_load",
    "debug_save",
    "debug_show_all",
    "tensor_home",
]
