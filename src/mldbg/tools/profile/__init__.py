"""Which files and functions a script really runs (``mldbg profile``), and pruning a
library checkout down to them (``mldbg prune``).

Kept light: ``python -m mldbg.tools.profile.runner`` imports this package inside the profiled
interpreter, before counting starts, so nothing heavy may be imported here.
"""
