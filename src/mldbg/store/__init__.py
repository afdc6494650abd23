"""The run store and the tensor store: what mldbg keeps on disk, and reading it back.

``runs`` (one directory per run, written crash-safe), ``current_run`` (the run this
process writes to), ``checkpoint`` (``debug_checkpoint`` records) and ``checkpoint_diff``
(two runs' records side by side), ``tensors`` (``debug_save`` / ``debug_load``), ``size``
(the guard that stops a store from filling the disk).  Standard library only at import:
the debuggee's agent writes here.
"""
