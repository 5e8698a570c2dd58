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

* `noise_following_switch`: below r = 1.15, with noise, the median moves
  to 0.1 after round 20 if the released C has doubled since round 10 (the
  clients' norms run away: the noise raises the loss, the loss C, C the
  noise); it reads only released norms, so it is post-processing.

Below r = 1.15 the default is therefore TFF's own adaptive clipping at the
median until round 20, and at 0.1 from then on where its norm has doubled
since round 10; from 1.15 adaptive clipping at the 0.1 quantile, from 1.6
adaptive normalization at it, and from 2 adaptive normalization at 0.03.
`resolve` applies the rules to a `DPSpec` once (`ResolvedMechanism`),
with an adaptive norm's split of z between the value and the clipped
counts (`noise_split`: Andrew et al.'s composition, the count noise
`default_clipped_count_stddev` unless given): the aggregator builds from
its result and a run records it.
The measurements the rule was chosen from are in docs/frontier_history_2.md
("A default that follows the noise") and docs/frontier_history_4.md ("The
0.03 quantile where the noise dominates", "A median that leaves when the
norms run away").
TensorFlow-free.

References:
* Andrew, Thakkar, McMahan, Ramaswamy 2021: "Differentially Private Learning
  with Adaptive Clipping", NeurIPS 2021 (the adaptive norm and its target
  quantile).
* Das et al. 2022: "On the Convergence of DP FL on Non-Lipschitz
  Objectives, and with Normalized Client Updates" (normalization).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Union

import numpy as np

from tff_clip import checks

__all__ = ['LOWEST_QUANTILE', 'LOWEST_QUANTILE_FROM', 'LOW_QUANTILE',
           'LOW_QUANTILE_FROM', 'MEDIAN', 'NORMALIZE_FROM', 'QuantileSwitch',
           'ResolvedMechanism', 'SWITCH_GROWTH', 'SWITCH_REFERENCE_ROUND',
           'SWITCH_ROUND', 'noise_following_bounding',
           'noise_following_quantile', 'noise_following_switch',
           'noise_to_bound_ratio', 'resolve']

# Chosen on the validation splits of the frontier's two settings (MNIST
# logistic regression, d = 7,850, and the digits MLP, d = 2,410; 1,000
# clients, n = 50, 100 rounds): docs/frontier_history_2.md, "A default that
# follows the noise".
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
# Below LOW_QUANTILE_FROM, with noise: the median until round SWITCH_ROUND,
# LOW_QUANTILE from then on if the released norm has grown SWITCH_GROWTH
# times since round SWITCH_REFERENCE_ROUND (validation: the median runs'
# C_20 / C_10 was 2.41 to 2.69 on MNIST, 1.44 to 1.67 on digits).
SWITCH_REFERENCE_ROUND = 10
SWITCH_ROUND = 20
SWITCH_GROWTH = 2.0


@dataclasses.dataclass(frozen=True)
class QuantileSwitch:
  """A target quantile that moves once, on the released norms alone.

  After round `at_round`, if the norm C released then is at least `growth`
  times the one released after round `reference_round`, the estimator
  tracks `quantile` from the next round on; otherwise it keeps its target
  for the rest of the run. It reads only C, which every round releases
  (noised: the count behind it is a DP release), so it is post-processing
  and costs no privacy budget: the ledger is the same with or without it.
  """
  reference_round: int
  at_round: int
  growth: float
  quantile: float

  def __post_init__(self):
    reference = checks.integer(self.reference_round, 'reference_round',
                               minimum=1)
    checks.integer(self.at_round, 'at_round', minimum=reference + 1)
    checks.positive_float(self.growth, 'growth')
    checks.probability(self.quantile, 'quantile', low_open=False,
                       high_open=False)


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
  measurements it was chosen from are in docs/frontier_history_2.md ("A
  default that follows the noise").
  """
  r = noise_to_bound_ratio(noise_multiplier, clients_per_round, dimension)
  if r < LOW_QUANTILE_FROM:
    return MEDIAN
  return LOW_QUANTILE if r < LOWEST_QUANTILE_FROM else LOWEST_QUANTILE


def noise_following_switch(noise_multiplier: float,
                           clients_per_round: float,
                           dimension: int) -> Optional[QuantileSwitch]:
  """The default's move from the median to 0.1 where the norms run away.

  Where `noise_following_quantile` is the median and there is noise (z >
  0), a `QuantileSwitch`: after round `SWITCH_ROUND` (20), if the released
  C has grown `SWITCH_GROWTH` (2) times since round `SWITCH_REFERENCE_ROUND`
  (10), the adaptive norm tracks `LOW_QUANTILE` (0.1) from then on. Where
  the clients' update norms keep growing (the noise each round adds to the
  weights raises the loss, the larger gradients raise C, and C the next
  round's noise), the lower quantile breaks that loop; where they level off
  as the model fits them, C grows less than that and the median stays.
  None elsewhere (a lower quantile already, or no noise). The rule reads
  public quantities; the switch reads the released C (post-processing).
  Chosen in docs/frontier_history_4.md, "A median that leaves when the
  norms run away".
  """
  quantile = noise_following_quantile(noise_multiplier, clients_per_round,
                                      dimension)
  if quantile != MEDIAN or noise_multiplier == 0:
    return None
  return QuantileSwitch(SWITCH_REFERENCE_ROUND, SWITCH_ROUND, SWITCH_GROWTH,
                        LOW_QUANTILE)


# ----------------------------------------------------------------------------
# The adaptive norm's noise split: the value and the clipped count share z.

def adaptive_noise_multipliers(noise_multiplier: float,
                               clipped_count_stddev: float,
                               num_counts: int = 1,
                               sensitivity: float = 1.0) -> float:
  """Value noise multiplier z_v so that value + counts are as private as z.

  The value (z_v) and the count vector (noise multiplier
  2 sigma_b / sqrt(k), sensitivity sqrt(k)/2) together form one Gaussian
  mechanism with z^-2 = z_v^-2 + k (2 sigma_b)^-2 (Andrew et al. 2021;
  TFF's `adaptive_clip_noise_params` for k = 1). k = H for per-layer
  quantiles. Under correlated noise a participation releases the value
  through a mechanism of sensitivity s (`NoiseMechanism.
  participation_sensitivity`: a Gaussian of z_v / s) beside a count of
  independent noise, and the pair is the Gaussian of z / s the run is
  calibrated for when z^-2 = z_v^-2 + k (2 s sigma_b)^-2 (s = 1: the above).
  """
  if noise_multiplier == 0:
    return 0.0
  count_term = num_counts * (2.0 * sensitivity * clipped_count_stddev)**-2
  remaining = noise_multiplier**-2 - count_term
  if remaining <= 0:
    minimum = math.sqrt(num_counts) * noise_multiplier / (2.0 * sensitivity)
    rule = 'sqrt(k) z / 2' if sensitivity == 1 else (
        f'sqrt(k) z / (2 s), s = {sensitivity:g} the noise mechanism\'s '
        'participation sensitivity')
    raise ValueError(
        f'`clipped_count_stddev` = {clipped_count_stddev:g} is too small for '
        f'`noise_multiplier` = {noise_multiplier:g}'
        f'{f" with {num_counts} per-layer counts" if num_counts > 1 else ""}: '
        f'it must exceed {minimum:g} ({rule}). Raise '
        '`clipped_count_stddev` or `clients_per_round`, or lower '
        '`noise_multiplier`.')
  return remaining**-0.5


# The value noise may rise by at most this factor to pay for the count noise.
MAX_VALUE_NOISE_INFLATION = 1.1


def default_clipped_count_stddev(noise_multiplier: float,
                                 clients_per_round: float,
                                 num_counts: int = 1,
                                 sensitivity: float = 1.0) -> float:
  """sigma_b = max(n / 20, sqrt(k) z / (2 s sqrt(1 - r^-2))), r = 1.1.

  Andrew et al. (2021) suggest sigma_b = n/20. From the composition
  z^-2 = z_v^-2 + k (2 s sigma_b)^-2 (`adaptive_noise_multipliers`; s the
  noise mechanism's participation sensitivity, 1 for independent noise),
  that is infeasible whenever sqrt(k) z / (2 s) >= n / 20 -- e.g. per-layer
  quantiles (k = H counts) at z = 1 with 20 clients -- and costs a large
  value-noise inflation just above that. The second term is the sigma_b at
  which the value noise is exactly r z: solving
  r^-2 z^-2 = z^-2 - k (2 s sigma_b)^-2 for sigma_b. Taking the larger of
  the two keeps n/20 where it is cheap and otherwise caps the inflation
  z_v / z at r = 1.1, so every z >= 0, n >= 1 and k >= 1 builds. Zero when
  z = 0 (the noise-free estimator).
  """
  if noise_multiplier == 0:
    return 0.0
  r = MAX_VALUE_NOISE_INFLATION
  capped = (math.sqrt(num_counts) * noise_multiplier /
            (2.0 * sensitivity * math.sqrt(1.0 - r**-2)))
  return max(clients_per_round / 20.0, capped)


def noise_split(noise_multiplier: float, clients_per_round: float,
                clipped_count_stddev: Optional[float] = None,
                num_counts: int = 1,
                sensitivity: float = 1.0) -> tuple[float, Optional[float]]:
  """(z_v, sigma_b): the value noise multiplier and the clipped count's noise
  of an adaptive norm at total z (`adaptive_noise_multipliers`), sigma_b the
  one given or `default_clipped_count_stddev`; sigma_b None where z = 0 (a
  noise-free estimator). `sensitivity`: the noise mechanism's participation
  sensitivity s (1 for independent noise), so that value and counts spend
  exactly the Gaussian of z / s the run is calibrated and accounted for.
  The one place the split is computed: the factory's query and `DPSpec`'s
  early check both take it from here."""
  count = clipped_count_stddev
  if count is None:
    count = default_clipped_count_stddev(noise_multiplier, clients_per_round,
                                         num_counts, sensitivity)
  value = adaptive_noise_multipliers(noise_multiplier, count, num_counts,
                                     sensitivity)
  return value, (None if noise_multiplier == 0 else count)


def split_sensitivity(noise) -> float:
  """s of `noise_split` for a noise mechanism (1 without one: independent
  noise, or TFF's own mechanisms' split)."""
  return 1.0 if noise is None else float(noise.participation_sensitivity)


@dataclasses.dataclass(frozen=True)
class ResolvedMechanism:
  """What a DP aggregation runs for an update of d numbers, decided once.

  Made by `resolve` (and, for TFF's baselines, by the training program with
  TFF's own defaults): the bounding that runs (`noise_following` resolved to
  clip or normalize), the target quantile the adaptive norm tracks (None: no
  adaptive norm), its `QuantileSwitch` (None: it never moves), and the public
  numbers they were resolved from: the noise multiplier z (None: a run
  without DP, bounded as at z = 0), the model's size d and the expected
  cohort n. `tff_clip.aggregation.dp.DPBoundingFactory` builds its query from
  it; the training program records `to_dict()` as config.json's `resolved`,
  which a resumed or reported run compares with what it resolves now. The
  program resolves once, from the model, and builds its factory from this
  very object (`DPBoundingFactory(spec, resolved=...)`).
  """
  bounding: str
  target_quantile: Optional[float]
  quantile_switch: Optional[QuantileSwitch]
  noise_multiplier: Optional[float]
  dimension: int
  clients_per_round: Union[int, float]
  # The adaptive norm's split of z (`noise_split`): the value's noise
  # multiplier and the clipped count's noise (None: no adaptive norm, or
  # z = 0). Without an adaptive norm the value's is z itself.
  value_noise_multiplier: Optional[float] = None
  clipped_count_stddev: Optional[float] = None
  # The model's layers (the tensors of an update): per-layer quantiles
  # track one count each.
  layers: int = 1

  def to_dict(self) -> dict:
    """The fields by name, the switch as a dict (JSON as recorded)."""
    out = {field.name: getattr(self, field.name)
           for field in dataclasses.fields(self)}
    if self.quantile_switch is not None:
      out['quantile_switch'] = dataclasses.asdict(self.quantile_switch)
    return out


def resolve(dp_spec, dimension: int, *, layers: int = 1,
            private: bool = True) -> ResolvedMechanism:
  """The one resolution of `dp_spec`'s defaults for an update of `dimension`.

  `dp_spec` is a `tff_clip.aggregation.spec.DPSpec` (checked already).
  From the public numbers z (`dp_spec.noise_multiplier`), n
  (`dp_spec.clients_per_round`) and d (`dimension`) alone, so it costs no
  privacy: the bounding
  (`noise_following` chooses clip or normalize), the target quantile (the
  one given, else the one that follows the noise; None without an adaptive
  norm) and its switch (only a quantile that follows the noise, with one
  adaptive norm, has one), and an adaptive norm's split of z between the
  value and the clipped counts (`noise_split`; one count per layer of the
  `layers` with per-layer quantiles). `private` False: a run without DP (z
  must be 0), recorded with noise multiplier None.
  """
  d = checks.integer(dimension, 'dimension', minimum=1)
  layers = checks.integer(layers, 'layers', minimum=1)
  z, n = dp_spec.noise_multiplier, dp_spec.clients_per_round
  if not private and z != 0:
    raise ValueError(f'`noise_multiplier` = {z:g} in a run without DP '
                     '(private=False); give 0.')
  quantile = switch = count_stddev = None
  value_z = z
  if dp_spec.adaptive:
    per_layer_counts = dp_spec.per_layer and dp_spec.per_layer_quantiles
    quantile = dp_spec.target_quantile
    if quantile is None:
      quantile = noise_following_quantile(z, n, d)
      if not per_layer_counts:
        switch = noise_following_switch(z, n, d)
    value_z, count_stddev = noise_split(
        z, n, dp_spec.clipped_count_stddev, layers if per_layer_counts else 1,
        split_sensitivity(dp_spec.noise))
  return ResolvedMechanism(
      bounding=dp_spec.bounding.resolve(z, n, d).name,
      target_quantile=quantile, quantile_switch=switch,
      noise_multiplier=z if private else None, dimension=d,
      # A count as an int (as the training program's flag gives it).
      clients_per_round=int(n) if float(n).is_integer() else n,
      value_noise_multiplier=value_z if private else None,
      clipped_count_stddev=count_stddev if private else None, layers=layers)
