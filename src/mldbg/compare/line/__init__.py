"""The line step: from a module or glue verdict to the first wrong line of the port.

``plan.py`` turns a comparison's verdict into what each script's re-run records (the
scope, the bound); ``read.py`` reads a run's line records back; ``align.py`` pairs the
port's values with the reference's by value; ``verdict.py`` follows the difference
through the code to the first line whose value has no counterpart.
"""
