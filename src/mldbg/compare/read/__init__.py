"""Stage 1 of a comparison: reading captures.

A capture directory, a run, a file or a directory of tensors becomes a :class:`Source`
(``sources.py``): its entries (one stored tensor each, mapped lazily by ``arrays.py``)
and its module calls, validated as they are read.  ``gather.py`` joins torchrun ranks'
captures into one source; ``load.py`` hands one captured tensor to a script.
"""
