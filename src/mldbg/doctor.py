"""Where the README has always named them: ``mldbg.doctor.imported_copy`` and
``mldbg.doctor.require_editable``.

The code lives in :mod:`mldbg.interpreters` (which Python runs the script, which copy of a
library it imports) and ``mldbg doctor`` itself in :mod:`mldbg.tools.doctor`.
"""

from .interpreters import imported_copy, require_editable
from .tools.doctor import doctor

__all__ = ["doctor", "imported_copy", "require_editable"]
