"""tff_clip: bound every client's update the right way before it is aggregated.

Subsystems (folders; each imports only from the ones above it in this list
and from the root modules `names` and `checks`):
  aggregation -- bounding (clip, normalize, per-layer), noise mechanisms
                 (independent, banded, tree, BLT), the DP query and
                 `dp_factory`, the non-private aggregators.
  privacy     -- accounting (epsilon, calibration, extrapolation), the privacy
                 ledger, client sampling, the canary audit.
  learning    -- client work (FAT-Clipping, BLUR, LUS, ...), optimizers (LAMB,
                 LARS), `build_fedavg`.
  runtime     -- the in-process runner, split execution on TFF's workers,
                 execution contexts, graph import, client data.
  program     -- the training program behind `python -m scripts.train`:
                 configuration, assembly, the round loop, the run directory.
Each folder's `__init__` lists its modules; nothing at the root only
re-exports another module.

Importing `tff_clip` (any of its modules) sets exactly two things, so that a
program using it prints nothing of TensorFlow's or TFF's own:
  * `TF_CPP_MIN_LOG_LEVEL=3` in `os.environ`, unless it is already set:
    TensorFlow's C++ log stays quiet (about ten lines at import on a machine
    without a GPU, and grappler's two lines for every TFF computation run;
    none concerns a result). TensorFlow reads it once, at its first log
    line (its import prints some), so this works only when `tff_clip` is
    imported before TensorFlow; no Python call can change it later. A
    program that imported TensorFlow first (the variable unset, or '1',
    which jax, imported by TensorFlow, sets) gets one warning
    (`LATE_IMPORT_NOTICE`) saying what to set. Set
    `TF_CPP_MIN_LOG_LEVEL` yourself (0: all lines, 1: no info, 2: errors
    only) to see them, or to quiet them whatever the import order.
  * one `atexit` hook that, if TFF was imported, closes TFF's default
    execution context while the interpreter is still whole (see
    `_close_tff_context`), instead of TFF's traceback at exit.
No context, Python logger or other setting is changed.
"""

import atexit as _atexit
import os as _os
import sys as _sys

__version__ = '0.1.0'

# Read by TensorFlow's C++ log once, at its first line (TensorFlow's import
# prints some): too late when TensorFlow came first. TensorFlow's import
# also imports jax, which sets the variable to '1' (after that first line),
# so unset or '1' with TensorFlow loaded means its log is on: said once.
_LATE = ('tensorflow' in _sys.modules and
         _os.environ.get('TF_CPP_MIN_LOG_LEVEL') in (None, '1'))
_os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

LATE_IMPORT_NOTICE = (
    'tff_clip: TensorFlow was imported before tff_clip, so its C++ log '
    'stays on (about 2 lines per TFF computation run); to quiet it, set '
    'TF_CPP_MIN_LOG_LEVEL=3 before TensorFlow loads (in the shell, or '
    'os.environ at the top of the program) or import tff_clip first.')
if _LATE:
  import warnings as _warnings  # pylint: disable=g-import-not-at-top
  _warnings.warn(LATE_IMPORT_NOTICE, stacklevel=2)


def _close_tff_context():
  """Stops TFF's default C++ worker while the interpreter is still whole.

  TFF 0.87 sets a local C++ context on import and stops its worker in a
  `__del__` that runs only at interpreter teardown, when `subprocess` is
  already gone: it prints "Exception ignored in: ...ServiceManager.__del__
  ... AttributeError: 'NoneType' object has no attribute 'Popen'" and can
  leak the worker, which holds our stdout open (a pipe reading a script's
  output then never ends). Replacing the default context at exit drops the
  old one while modules still work. Looked up, not imported: a program that
  never imported TFF does not import it at exit.
  """
  tff = _sys.modules.get('tensorflow_federated')
  if tff is None:
    return

  class _ClosedContext(tff.framework.SyncContext):

    def invoke(self, comp, arg):
      raise RuntimeError('The TFF context was closed at interpreter exit.')

  _terminate_tff_default_workers()
  try:
    tff.framework.set_default_context(_ClosedContext())
  except Exception:  # pylint: disable=broad-except
    pass  # Never let exit clean-up raise.


def _terminate_tff_default_workers():
  """SIGTERM to the `worker_binary` children TFF's own contexts started.

  TFF stops its default worker with SIGINT and waits for it. A process
  started with SIGINT ignored (nohup, a background job) passes that on to
  the worker, which then never stops, and the wait blocks forever (at exit,
  or where the context is replaced). Terminated first, the worker is reaped
  by that wait at once. Only a child whose pid a TFF `ServiceManager` holds
  is signalled: a worker the program started itself is left alone, and
  tff_clip's own workers are children of their launcher, not of this
  process (`tff_clip.runtime.execution` stops them).
  """
  import signal  # pylint: disable=g-import-not-at-top
  children = []
  try:  # Each thread's children (TFF starts its worker from its own thread).
    for task in _os.listdir('/proc/self/task'):
      with open(f'/proc/self/task/{task}/children') as f:
        children += [int(pid) for pid in f.read().split()]
  except (OSError, ValueError):
    return  # Not Linux, or no children file: nothing to do here.
  workers = []
  for pid in children:
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        program = f.read().split(b'\0', 1)[0]
    except OSError:
      continue  # Gone already.
    if _os.path.basename(program) == b'worker_binary':
      workers.append(pid)
  if not workers:
    return
  import gc  # pylint: disable=g-import-not-at-top
  owned = set()
  for obj in gc.get_objects():  # About a second in a large program.
    kind = type(obj)
    if kind.__name__ == 'ServiceManager' and kind.__module__.startswith(
        'tensorflow_federated.'):
      pid = getattr(getattr(obj, '_process', None), 'pid', None)
      if isinstance(pid, int):
        owned.add(pid)
  for pid in workers:
    if pid in owned:
      try:
        _os.kill(pid, signal.SIGTERM)
      except OSError:
        pass  # Gone already.


_atexit.register(_close_tff_context)
