"""The default target quantile of adaptive bounding: one that follows the noise.

The noise a DP round adds to the mean of n bounded updates has norm about
z C sqrt(d) / n; a bounded update has norm at most C. Their ratio r =
z sqrt(d) / n (`noise_to_bound_ratio`) is known before a run starts from
public numbers alone (the noise multiplier, the expected cohort size, the
model's size), so a default chosen from it costs no privacy and needs no
accounting. `noise_following_quantile` maps it to the target quantile the
adaptive norm tracks (Andrew et al. 2021's gamma): high where the noise is
small next to C, low where it dominates. TensorFlow-free.

References:
* Andrew, Thakkar, McMahan, Ramaswamy 2021: "Differentially Private Learning
  with Adaptive Clipping", NeurIPS 2021 (the adaptive norm and its target
  quantile).
"""

import math

import numpy as np

from tff_clip import checks

__all__ = ['QUANTILE_AT_HIGH_NOISE', 'QUANTILE_AT_LOW_NOISE',
           'noise_following_quantile', 'noise_to_bound_ratio']

# (r, gamma) anchors of `noise_following_quantile`: gamma_hi at or below
# r_lo, gamma_lo at or above r_hi, log-linear in r between. Chosen on the
# validation splits of the frontier's two settings (MNIST logistic
# regression, d = 7,850, and the digits MLP, d = 2,410; 1,000 clients, n = 50,
# 100 rounds): docs/frontier.md, "A default that follows the noise".
QUANTILE_AT_LOW_NOISE = (0.9, 0.7)
QUANTILE_AT_HIGH_NOISE = (1.6, 0.1)


def noise_to_bound_ratio(noise_multiplier: float, clients_per_round: float,
                         dimension: int) -> float:
  """r = z sqrt(d) / n: the norm of the noise on the mean update, in C.

  The noise N(0, (z C)^2 I_d) on the sum of n bounded updates, divided by
  n, has norm about z C sqrt(d) / n, and every bounded update has norm at
  most C. Public: the noise multiplier, the expected cohort size and the
  model's size are all known before a run starts.
  """
  z = checks.nonnegative_float(noise_multiplier, 'noise_multiplier',
                               np.float64)
  n = checks.positive_float(clients_per_round, 'clients_per_round',
                            np.float64)
  d = checks.integer(dimension, 'dimension', minimum=1)
  return z * math.sqrt(d) / n


def noise_following_quantile(noise_multiplier: float,
                             clients_per_round: float,
                             dimension: int) -> float:
  """The default target quantile gamma of adaptive bounding, from the noise.

  Where the noise is small next to a bounded update (`noise_to_bound_ratio`
  r at most 0.9) a high quantile (0.7) keeps most updates whole: their
  directions, not the noise, limit the model. Where the noise dominates (r
  at least 1.6) a low one (0.1) keeps C, and with it the noise z C that
  enters the weights every round, a small fraction of the update norms.
  Between, log gamma is linear in r (0.7 at 0.9, 0.27 at 1.25, 0.1 at 1.6).
  It reads only public quantities (z, n, d), so it costs no privacy; the
  rule and the measurements it was chosen from are in docs/frontier.md
  ("A default that follows the noise"). z = 0 (no noise) gives 0.7.
  """
  r = noise_to_bound_ratio(noise_multiplier, clients_per_round, dimension)
  (r_lo, q_hi), (r_hi, q_lo) = QUANTILE_AT_LOW_NOISE, QUANTILE_AT_HIGH_NOISE
  if r <= r_lo:
    return q_hi
  if r >= r_hi:
    return q_lo
  t = (r - r_lo) / (r_hi - r_lo)
  return float(math.exp((1 - t) * math.log(q_hi) + t * math.log(q_lo)))
