"""tff_clip: bound every client's update the right way before it is aggregated.

Modules (data flows down this list):
  spec         -- the DP aggregation's arguments, checked once (no TF import).
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
  run_records  -- a run directory as a checked record (atomic, hash-chained).
  split_execution -- client work on TFF's C++ workers, the server here.

Importing `tff_clip` changes nothing: no context, hook or log level is set.
"""

__version__ = '0.1.0'
