"""Stage 2 of a comparison: pairing the reference's entries with the port's.

By module path after an optional map (``mapping.py``; ``propose.py`` proposes one when few
names pair), arguments of one call by shape and order (``align.py``), activation layouts by
framework (``layout.py``), and generation loops whose calls split a sequence differently
regrouped first (``sequence_calls.py``).
"""
