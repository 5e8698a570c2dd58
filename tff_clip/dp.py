"""`tff_clip.dp`: the same module as `tff_clip.aggregation.dp`.

Kept so that code importing `tff_clip.dp` (the name before the library's
subsystems became folders) keeps working; new code imports
`tff_clip.aggregation.dp`.
"""

import importlib as _importlib
import sys as _sys

_sys.modules[__name__] = _importlib.import_module('tff_clip.aggregation.dp')
