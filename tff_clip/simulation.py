"""`tff_clip.simulation`: the same module as `tff_clip.runtime.simulation`.

Kept so that code importing `tff_clip.simulation` (the name before the library's
subsystems became folders) keeps working; new code imports
`tff_clip.runtime.simulation`.
"""

import importlib as _importlib
import sys as _sys

_sys.modules[__name__] = _importlib.import_module('tff_clip.runtime.simulation')
