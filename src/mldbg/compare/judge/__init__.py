"""Stage 3 of a comparison: judging each pair.

``metrics.py`` reduces a pair's tensors chunk by chunk to its error numbers; ``bounds.py``
says what error the dtype's rounding and the op's measured conditioning explain at that
entry; ``sketched.py`` estimates a pair's error when a side kept only statistics and a
sketch.
"""
