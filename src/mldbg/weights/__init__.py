"""The weight audit (``mldbg weights``): are the port's parameters the reference's?

Its own package, beside ``compare`` rather than inside it: it judges parameters, not
activations, and answers a verb of its own.  ``audit.py`` is its face and order of work;
``collect.py`` and ``ranks.py`` collect each side's parameters (``params.py``);
``judge.py`` judges a pair (missing, never loaded, layout, dtype, values) with
``layouts.py`` and ``closeness.py``; ``structure.py`` finds fused, tied and renamed ones;
``render.py`` says it for a person; ``quantized.py`` decodes MLX-quantized weights and
bounds what quantization moves.  It reads captures
through ``compare.read`` and takes its name maps from ``compare.pair``.
"""
