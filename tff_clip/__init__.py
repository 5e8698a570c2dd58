"""tff_clip: bound every client's update the right way before it is aggregated.

Modules (data flows down this list):
  bounding     -- pure-TF norms, clip, normalize, per-layer budgets.
  client       -- client work: BLUR, LUS, model clipping (baseline).
  optimizers   -- per-step clipped optimizer, LAMB, LARS, schedules.
  aggregators  -- non-private TFF aggregation factories built on `bounding`.
  dp           -- Gaussian-noise DP queries and `dp_factory` (user-level DP).
  algorithms   -- `build_fedavg`: one call composing all of the above.
  accounting   -- epsilon of DpEvents on dp_accounting; calibration,
                  extrapolation (no TF import).
  privacy_ledger -- the DpEvents a run actually ran, and their JSON format.
  sampling     -- seeded Poisson / fixed-size client sampling.
  training     -- the training program behind `python -m scripts.train`.
  plotting     -- the run's PNG plot.
  execution    -- TFF C++ execution contexts whose workers never leak.
"""

__version__ = '0.1.0'


def _close_tff_context_at_exit():
  """Stops TFF's default C++ worker while the interpreter is still whole.

  TFF 0.87 sets a local C++ context on import and stops its worker in a
  `__del__` that runs only at interpreter teardown, when `subprocess` is
  already gone: it prints "Exception ignored ... ServiceManager.__del__" and
  leaks the worker, which holds our stdout open (a pipe reading a script's
  output then never ends). Replacing the default context at exit drops the
  old one while modules still work. TFF itself is never imported here.
  """
  import sys  # pylint: disable=g-import-not-at-top
  tff = sys.modules.get('tensorflow_federated')
  if tff is None:
    return

  class _ClosedContext(tff.framework.SyncContext):

    def invoke(self, comp, arg):
      raise RuntimeError('The TFF context was closed at interpreter exit.')

  try:
    tff.framework.set_default_context(_ClosedContext())
  except Exception:  # pylint: disable=broad-except
    pass  # Never let exit clean-up raise.


import atexit as _atexit  # pylint: disable=g-import-not-at-top,wrong-import-position
_atexit.register(_close_tff_context_at_exit)
