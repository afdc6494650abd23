"""Stage 4 of a comparison: naming where the port goes wrong.

``rules.py`` is the verdict: small named rules applied in a documented order;
``divergence.py`` the mechanics they share (boundary differences, the error a call's
inputs bring, modules one side never calls).  ``ops.py`` narrows a culprit module to the
framework operation inside it that diverges; ``nonfinite.py`` finds the first call of one
capture whose output is not finite.
"""
