"""``python -m mldbg`` is the ``mldbg`` command."""

from mldbg.cli.main import main

raise SystemExit(main())
