"""The command-line programs of tff_clip (run from the checkout).

Importing any of them first quiets TensorFlow's own start-up logging, before
TensorFlow is imported: on a machine without a GPU, TensorFlow 2.14 prints
about ten error-level lines at import (cuDNN/cuFFT/cuBLAS factories, TensorRT)
and grappler prints "Failed to detect the fetch node(s)" for every traced
function; none of them concerns a run. Set `TF_CPP_MIN_LOG_LEVEL` yourself
(0-2) to see them again. Our own warnings (absl, stderr) still show.

A Ctrl-C before a script's `cli.run` starts (while it imports TensorFlow,
say) ends it with one line too, not a traceback: `scripts.cli` says how
every script ends.
"""

import logging as _logging
import os as _os
import sys as _sys

_os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
_os.environ.setdefault('GRPC_VERBOSITY', 'ERROR')
# TensorFlow's Python logger ('WARNING:tensorflow:...' deprecation notices).
_logging.getLogger('tensorflow').setLevel(_logging.ERROR)

_excepthook = _sys.excepthook


def _interrupted_before_run(kind, value, traceback):
  if issubclass(kind, KeyboardInterrupt):  # Python then exits by SIGINT.
    print('interrupted: rerun the same command to run it again',
          file=_sys.stderr, flush=True)
  else:
    _excepthook(kind, value, traceback)


_sys.excepthook = _interrupted_before_run
