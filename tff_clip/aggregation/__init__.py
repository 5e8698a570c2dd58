"""Aggregation: what a round does to the clients' updates before it releases a sum.

  spec             -- the DP aggregation's arguments (`DPSpec`), checked once (no TF import).
  noise_following  -- the default target quantile, from the noise's size next to C (no TF import).
  boundings        -- the bounding methods as objects (clip, normalize, per-layer), by name.
  noise_mechanisms -- the noise mechanism base class and independent Gaussian noise.
  correlated_noise -- banded and tree (correlated) noise mechanisms.
  blt_matrix       -- BLT matrices: parameterization, inverse, streaming, sensitivity.
  blt              -- buffered linear Toeplitz (BLT) noise: its optimization, the mechanism.
  mechanisms       -- the registries: a public name to its bounding or noise mechanism.
  bounding         -- pure-TF norms, clip, normalize, per-layer budgets.
  aggregators      -- non-private TFF aggregation factories built on `bounding`.
  dp_queries       -- the DP sum queries (tensorflow-privacy `DPQuery`).
  dp               -- `dp_factory`: Gaussian-noise DP aggregation factories (user-level DP).
  baselines        -- TFF's own DP aggregators, as the baselines the scripts compare with.

Imports nothing from the other subsystems.
"""
