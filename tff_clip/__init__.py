"""tff_clip: bound every client's update the right way before it is aggregated.

Modules:
  bounding     -- pure-TF norms, clip, normalize, per-layer budgets.
  aggregators  -- TFF aggregation factories built on `bounding`.
  execution    -- TFF C++ execution contexts whose workers never leak.
"""

__version__ = '0.1.0'
