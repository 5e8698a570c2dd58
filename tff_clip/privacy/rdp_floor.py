"""The least epsilon RDP accounting can prove at a delta (only `math`).

dp_accounting's RDP accountant turns the RDP r(a) of a mechanism at orders
a into

    epsilon = min_a [r(a) + log(1 - 1/a) - log(delta a) / (a - 1)]

(Canonne, Kamath, Steinke 2020, Prop. 12; `rdp.compute_epsilon`, then
max(0, .)). A Renyi divergence is >= 0, so no mechanism, at any noise
multiplier, gets an RDP epsilon below `epsilon_floor(delta)`, the same
minimum with r = 0 (computed with dp_accounting's expression, term for
term, so the comparison is exact in floating point). Noise only moves r(a)
towards 0: a target epsilon below the floor is one calibration could
never reach, known without dp_accounting (~0.4 s to import) or a single
accountant evaluation. `tff_clip.privacy.accountants` raises every r(a) to
2 delta^2, which keeps dp_accounting's KL shortcut (epsilon = 0 once
r(a) < delta^2) off wherever the floor is positive (delta < ~3.6e-4).
"""

import math

__all__ = ['RDP_ORDERS', 'check_reachable', 'epsilon_floor']

# dp_accounting's default Renyi orders (`rdp_privacy_accountant.
# DEFAULT_RDP_ORDERS`: 1.1 ... 10.9, 11 ... 63, 128 ... 1024), written out so
# that they are known without importing it (tests/test_accounting.py pins
# the two lists equal).
RDP_ORDERS = tuple([1 + x / 10. for x in range(1, 100)] +
                   list(range(11, 64)) + [128, 256, 512, 1024])


def epsilon_floor(delta: float) -> float:
  """The smallest epsilon RDP accounting at `RDP_ORDERS` gives at `delta`
  (in (0, 1)), for any mechanism: 0 where delta is large (>= ~3.6e-4)."""
  return max(0.0, min(
      math.log1p(-1 / order) - math.log(delta * order) / (order - 1)
      for order in RDP_ORDERS))


def check_reachable(target_epsilon: float, delta: float) -> None:
  """ValueError naming `target_epsilon` if it is below `epsilon_floor`."""
  floor = epsilon_floor(delta)
  if target_epsilon < floor:
    raise ValueError(
        f'`target_epsilon` = {target_epsilon!r} is unreachable at delta = '
        f'{delta:g}: RDP accounting cannot prove less than epsilon = '
        f'{floor:.6g} at this delta, whatever the noise multiplier. Ask for '
        f'a target_epsilon above {floor:.3g}, or a larger delta.')
