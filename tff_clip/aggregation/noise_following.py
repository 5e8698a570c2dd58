"""tff_clip's default bounding and target quantile: they follow the noise.

The noise a DP round adds to the mean of n bounded updates has norm about
z C sqrt(d) / n; a bounded update has norm at most C. Their ratio r =
z sqrt(d) / n (`noise_to_bound_ratio`) is known before a run starts from
public numbers alone (the noise multiplier, the expected cohort size, the
model's size), so a default chosen from it costs no privacy and needs no
accounting. From r:

* `noise_following_quantile`: the target quantile the adaptive norm tracks
  (Andrew et al. 2021's gamma): the median (0.5, their default and TFF's)
  below `LOW_QUANTILE_FROM` (r = 1.15), `LOW_QUANTILE` (0.1) from there,
  and `LOWEST_QUANTILE` (0.03) from `LOWEST_QUANTILE_FROM` (r = 2) on:
  where the noise dominates, a small C keeps the noise z C that enters the
  weights every round small next to the update norms.
* `noise_following_bounding`: below `NORMALIZE_FROM` (r = 1.6), clipping;
  from it on, normalization. Where the noise is small next to C, the
  clients' update directions limit the model, and clipping keeps the small
  updates of clients the model already fits small; normalization scales
  them up to C. Where the noise dominates, every update's full share of C
  is signal, and normalization gives it.

Below r = 1.15 the default is therefore TFF's own adaptive clipping at the
median; from 1.15 adaptive clipping at the 0.1 quantile, from 1.6
adaptive normalization at it, and from 2 adaptive normalization at 0.03.
The measurements the rule was chosen from are in docs/frontier.md ("A
default that follows the noise", "The 0.03 quantile where the noise
dominates"). TensorFlow-free.

References:
* Andrew, Thakkar, McMahan, Ramaswamy 2021: "Differentially Private Learning
  with Adaptive Clipping", NeurIPS 2021 (the adaptive norm and its target
  quantile).
* Das et al. 2022: "On the Convergence of DP FL on Non-Lipschitz
  Objectives, and with Normalized Client Updates" (normalization).
"""

import math

import numpy as np

from tff_clip import checks

__all__ = ['LOWEST_QUANTILE', 'LOWEST_QUANTILE_FROM', 'LOW_QUANTILE',
           'LOW_QUANTILE_FROM', 'MEDIAN', 'NORMALIZE_FROM',
           'noise_following_bounding', 'noise_following_quantile',
           'noise_to_bound_ratio']

# Chosen on the validation splits of the frontier's two settings (MNIST
# logistic regression, d = 7,850, and the digits MLP, d = 2,410; 1,000
# clients, n = 50, 100 rounds): docs/frontier.md, "A default that follows
# the noise".
# r from which the target quantile is LOW_QUANTILE (below it, MEDIAN).
LOW_QUANTILE_FROM = 1.15
MEDIAN = 0.5
LOW_QUANTILE = 0.1
# r from which the target quantile is LOWEST_QUANTILE (MNIST at r = 2.32:
# +7.4 points on validation over 0.1; digits at r = 2.0 and 2.37: ties).
LOWEST_QUANTILE_FROM = 2.0
LOWEST_QUANTILE = 0.03
# r from which the default bounding normalizes (below it, it clips).
NORMALIZE_FROM = 1.6


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


def noise_following_bounding(noise_multiplier: float,
                             clients_per_round: float,
                             dimension: int) -> str:
  """The default bounding from the noise: 'clip' or 'normalize'.

  'normalize' where `noise_to_bound_ratio` r is at least `NORMALIZE_FROM`
  (1.6), 'clip' below (z = 0, no noise, included). It reads only public
  quantities (z, n, d), so it costs no privacy.
  """
  r = noise_to_bound_ratio(noise_multiplier, clients_per_round, dimension)
  return 'normalize' if r >= NORMALIZE_FROM else 'clip'


def noise_following_quantile(noise_multiplier: float,
                             clients_per_round: float,
                             dimension: int) -> float:
  """The default target quantile gamma of adaptive bounding, from the noise.

  The median (0.5) where `noise_to_bound_ratio` r is below
  `LOW_QUANTILE_FROM` (1.15; z = 0 included), 0.1 from there, and 0.03
  from `LOWEST_QUANTILE_FROM` (2) on: where the noise dominates, a low
  quantile keeps C, and with it the noise z C that enters the weights
  every round, a small fraction of the update norms. It reads only public
  quantities (z, n, d), so it costs no privacy; the rule and the
  measurements it was chosen from are in docs/frontier.md ("A default that
  follows the noise").
  """
  r = noise_to_bound_ratio(noise_multiplier, clients_per_round, dimension)
  if r < LOW_QUANTILE_FROM:
    return MEDIAN
  return LOW_QUANTILE if r < LOWEST_QUANTILE_FROM else LOWEST_QUANTILE
