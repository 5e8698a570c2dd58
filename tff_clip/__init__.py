"""tff_clip: bound every client's update the right way before it is aggregated.

Modules (data flows down this list):
  bounding     -- pure-TF norms, clip, normalize, per-layer budgets.
  client       -- client work: BLUR, LUS, model clipping (baseline).
  optimizers   -- per-step clipped optimizer, LAMB, LARS, schedules.
  aggregators  -- non-private TFF aggregation factories built on `bounding`.
  dp           -- Gaussian-noise DP queries and `dp_factory` (user-level DP).
  algorithms   -- `build_fedavg`: one call composing all of the above.
  accounting   -- the privacy ledger on dp_accounting (no TF import).
  sampling     -- seeded Poisson / fixed-size client sampling.
  training     -- the training program behind `python -m scripts.train`.
  plotting     -- the run's PNG plot.
  execution    -- TFF C++ execution contexts whose workers never leak.
"""

__version__ = '0.1.0'
