"""Privacy: what a run's releases cost, and how that is checked.

  rdp_floor        -- the least epsilon RDP accounting can prove at a delta (no imports).
  accountants      -- dp_accounting's RDP and PLD accountants, as used here.
  pld_numpy        -- dp_accounting's PLD arithmetic in NumPy, the same bits.
  accounting       -- epsilon of DpEvents; calibration, extrapolation (no TF import).
  privacy_ledger   -- the DpEvents a run actually ran, and their JSON format.
  sampling         -- seeded Poisson, fixed-size and minimum-separation client sampling.
  audit            -- canary clients and the one-run empirical epsilon.
  audit_statistics -- the audit's statistics (no TF import).

Imports from `tff_clip.aggregation` (a mechanism's event), never from above.
"""
