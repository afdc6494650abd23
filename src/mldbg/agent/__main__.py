"""``python -m mldbg.agent [-m MODULE | SCRIPT] [ARGS...]``, started by the mldbg daemon."""

import sys

from mldbg.agent.runner import main

sys.exit(main())
