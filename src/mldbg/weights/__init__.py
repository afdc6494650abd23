"""The weight audit (``mldbg weights``): are the port's parameters the reference's?

Its own package, beside ``compare`` rather than inside it: it judges parameters, not
activations, and answers a verb of its own.  ``audit.py`` collects both sides' parameters
and judges each pair (missing, never loaded, layout, dtype, values); ``quantized.py``
decodes MLX-quantized weights and bounds what quantization moves.  It reads captures
through ``compare.read`` and takes its name maps from ``compare.pair``.
"""
