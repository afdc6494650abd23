"""The part of mldbg that runs inside the debugged process.

Standard library only, and nothing heavy at import: it is put on the debuggee's
``PYTHONPATH`` by the daemon, so any interpreter >= 3.10 can be debugged without
installing anything into its environment.  Start it with ``python -m mldbg.agent``.
"""
