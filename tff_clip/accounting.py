"""`tff_clip.accounting`: the same module as `tff_clip.privacy.accounting`.

Kept so that code importing `tff_clip.accounting` (the name before the library's
subsystems became folders) keeps working; new code imports
`tff_clip.privacy.accounting`.
"""

import importlib as _importlib
import sys as _sys

_sys.modules[__name__] = _importlib.import_module('tff_clip.privacy.accounting')
