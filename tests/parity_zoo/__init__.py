"""The port zoo: tiny reference models, their ports, and bugs planted in the ports.

``cases.all_cases()`` lists every (architecture, dtype, bug); ``cases.build(case)``
returns a :class:`~parity_zoo.core.ZooPort` (reference, port, inputs, the compare map
and the module a correct verdict names).  Everything is built from configs with
seeded random weights; nothing is downloaded.
"""

from .cases import BUGS, BUILDERS, Case, all_cases, build
from .core import DTYPES, UnknownCase, ZooPort

__all__ = ["BUGS", "BUILDERS", "DTYPES", "Case", "UnknownCase", "ZooPort", "all_cases", "build"]
