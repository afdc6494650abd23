"""The porting toolbox: ``doctor`` (which copy of each library the script imports),
``killall`` (end stray debuggees), ``profile`` (what a script really runs, and pruning a
repository to it) and ``tutorial`` (a guided walk on a bundled model)."""
