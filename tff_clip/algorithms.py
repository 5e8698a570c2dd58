"""`tff_clip.algorithms`: the same module as `tff_clip.learning.algorithms`.

Kept so that code importing `tff_clip.algorithms` (the name before the library's
subsystems became folders) keeps working; new code imports
`tff_clip.learning.algorithms`.
"""

import importlib as _importlib
import sys as _sys

_sys.modules[__name__] = _importlib.import_module('tff_clip.learning.algorithms')
