"""What a DP aggregation is, checked once: a frozen, TensorFlow-free spec.

`DPSpec` declares the DP parameters once -- their names, defaults and
meaning (each field's `help`) -- for `tff_clip.aggregation.dp.dp_factory` (whose
signature is generated from them), the training program's
`tff_clip.program.config.TrainConfig` and its flags. It checks them all when it is
made (the TypeError / ValueError of `tff_clip.checks`, naming the argument;
the bounding and the noise mechanism are looked up in `tff_clip.aggregation.mechanisms`
and check themselves), and is then the one description of the mechanism
that the factory, the flags (`tff_clip.program.config.validate`) and the audit read.
The per-layer split's rules (`check_split`, `ExplicitBudgets`) live here
too (the adaptive norm's noise split is `tff_clip.aggregation.
noise_following.noise_split`, which the spec's early check calls), and so
do the rules of the client algorithms (`check_client_arguments`: BLUR, LUS, model clipping,
per-step clipping), so that checking a configuration imports no TensorFlow.

References:
* Andrew, Thakkar, McMahan, Ramaswamy 2021: "Differentially Private Learning
  with Adaptive Clipping", NeurIPS 2021 (the count noise and its
  composition with the value noise).
* Cheng et al. 2022: "Differentially Private Federated Learning with
  Local Regularization and Sparsification", CVPR 2022 (BLUR, LUS).
* Pelikan et al. 2025: "Enabling Differentially Private Federated
  Learning for Speech Recognition", NeurIPS 2025 (per-layer budgets and
  their sum rule).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Optional, Union

import numpy as np

from tff_clip import checks
from tff_clip.aggregation import blt
from tff_clip.aggregation import mechanisms
from tff_clip.aggregation import noise_following
from tff_clip.names import DENOMINATORS, NOISE_PLACEMENTS, SPLITS

__all__ = ['DPSpec', 'ExplicitBudgets', 'MIN_NOISE_STDDEV',
           'NOISE_TAIL_STDDEVS', 'PARAMETERS',
           'Split', 'Sparsity', 'check_client_arguments', 'check_sparsity',
           'check_split', 'parameter', 'parameters_doc']


class ExplicitBudgets:
  """Per-layer clip norms given explicitly, one per leaf.

  They must satisfy the sum rule `sum(b**2) == clip_norm**2` (Pelikan et al.
  2025: the total L2 sensitivity of per-layer clipping is the root of the
  summed squared budgets). Use this wrapper to tell explicit budgets from
  per-layer weights, which are given as a plain sequence.
  """

  def __init__(self, budgets: Sequence[float]):
    values = np.asarray(budgets, dtype=np.float64).reshape(-1)
    if values.size == 0 or not np.all(np.isfinite(values)) or np.any(
        np.signbit(values)):
      raise ValueError(
          '`split` budgets must be a non-empty sequence of finite, '
          f'non-negative floats; got {budgets!r}.')
    self.values = values

  def __repr__(self):
    return f'ExplicitBudgets({self.values.tolist()})'


Split = Union[str, Sequence[float], ExplicitBudgets]


def check_split(split: Split, num_layers: int | None = None,
                label: str = 'split'):
  """Validates `split` (and, when known, its length against the layer count)."""
  if isinstance(split, str):
    if split not in SPLITS:
      raise ValueError(
          f'`{label}` must be one of {SPLITS}, a sequence of positive per-layer '
          f'weights or `ExplicitBudgets`; got {split!r}.')
    return
  if isinstance(split, ExplicitBudgets):
    values = split.values
  else:
    try:
      values = np.asarray(split, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as e:
      raise TypeError(
          f'`{label}` must be a split name {SPLITS}, a sequence of positive '
          f'per-layer weights or `ExplicitBudgets`; got {split!r}.') from e
    if values.size == 0 or not np.all(np.isfinite(values)) or np.any(
        values <= 0):
      raise ValueError(
          f'`{label}` per-layer weights must all be positive and finite; got '
          f'{split!r}.')
  if num_layers is not None and values.size != num_layers:
    raise ValueError(
        f'`{label}` gives {values.size} per-layer values but the update has '
        f'{num_layers} layers (leaves); give one per layer.')


# ----------------------------------------------------------------------------
# Noise calibration for adaptive clipping (Andrew et al. 2021, Sec. 3).


# The noise of a coordinate is taken to stay within this many standard
# deviations: P(|N(0, 1)| > 10) = 1.5e-23 (`DPSpec.check_noise_scale`).
NOISE_TAIL_STDDEVS = 10.0
# The least noise std z S a round may draw with: 2^24 times float32's least
# normal number, so z S u stays a normal float32 (not flushed to 0) unless
# |u| < 2^-24 (`DPSpec.check_noise_scale`; an adaptive C is kept at or
# above it, `dp_queries.BoundedGaussianSumQuery.least_clip_norm`).
MIN_NOISE_STDDEV = 2.0**24 * float(np.finfo(np.float32).tiny)

# numpy cannot describe bfloat16 (an `ml_dtypes` type): its largest value.
_BFLOAT16_MAX = 3.3895313892515355e38


def _largest(dtype) -> float:
  """The largest finite value of a float dtype (bfloat16 included)."""
  if dtype.name == 'bfloat16':
    return _BFLOAT16_MAX
  return float(np.finfo(dtype).max)


def greatest_norm(noise_multiplier, clients_per_round: float, dtypes,
                  minimum=min):
  """The largest S whose noise 10 z S, noisy sum (n + 10 z) S and noisy
  mean S (1 + 10 z / n) fit float32, the sum's dtype and each leaf dtype of
  `dtypes`: what `DPSpec.check_noise_scale` accepts, for an adaptive norm
  that moves after that check (`dp_queries.AdaptiveBoundedSumQuery` keeps
  it at or below this; a bounded record's entry, at most S, then fits its
  leaf's dtype: an inf before the noise would show through it). z a float
  or a tensor (`minimum` then `tf.minimum`)."""
  z, n, tail = noise_multiplier, clients_per_round, NOISE_TAIL_STDDEVS
  f32 = np.finfo(np.float32)
  bounds = [f32.max / (tail * z + f32.tiny)]
  for dtype in map(np.dtype, dtypes):
    sum_max = np.finfo(np.float64 if dtype == np.float64 else np.float32).max
    bounds += [float(sum_max) / (n + tail * z),
               _largest(dtype) / (1.0 + tail * z / n)]
  result = bounds[0]
  for bound in bounds[1:]:
    result = minimum(result, bound)
  return result


# ----------------------------------------------------------------------------
# The mechanism.


def _parameter(help_text: str, default=dataclasses.MISSING, choices=None):
  """A DP parameter: its default and meaning, declared once (`DPSpec`)."""
  return dataclasses.field(default=default, metadata=dict(
      help=help_text, choices=choices))


def _noise_mechanisms_help() -> str:
  """Each registered mechanism's name and the summary of its docstring."""
  summaries = []
  for cls in mechanisms.NOISE_MECHANISMS.classes:
    summary = cls.__doc__.split('\n\n')[0]
    summaries.append(f'{cls.name}: {" ".join(summary.split()).rstrip(".")}')
  return '; '.join(summaries)


@dataclasses.dataclass(frozen=True)
class DPSpec:
  """The DP aggregation of `tff_clip.aggregation.dp.dp_factory`, checked when made.

  The fields are the DP parameters, declared here once: `dp_factory`'s
  keyword arguments and the flags of `scripts.train` share their names,
  defaults and meaning (each field's `help`; `parameters_doc()`). The values
  are stored as checked (floats as Python floats). Raises TypeError for a
  value of the wrong type and ValueError for one out of range, naming the
  argument (`bounding_method` is named `bounding`, as on the command line).
  `bounding` and `noise` are the looked-up objects
  (`tff_clip.aggregation.mechanisms`).
  """
  bounding_method: str = _parameter(
      'How each client update is bounded before aggregation: one of '
      f'{", ".join(mechanisms.BOUNDINGS.names)} (`tff_clip.aggregation.bounding`).')
  noise_multiplier: float = _parameter(
      'z >= 0, the TOTAL noise multiplier: noise N(0, (z S)^2 I) on the sum, '
      'S the L2 sensitivity; with adaptive clipping the value noise is '
      'raised so the round is exactly as private as one Gaussian mechanism '
      'with z (`noise_following.adaptive_noise_multipliers`). z = 0 (or -0.0): no noise, '
      'the bounding alone, NOT private (epsilon infinite).')
  clients_per_round: float = _parameter(
      'n > 0, the expected cohort size: the denominator, and an input of the '
      'default count noise `noise_following.default_clipped_count_stddev`.')
  clip_norm: Union[float, str] = _parameter(
      "Clip norm C > 0, or 'adaptive': start at `initial_clip_norm` and "
      'track `target_quantile` of the client norms.', 'adaptive')
  split: Split = _parameter(
      'Per-layer boundings: how a fixed C (or one adaptive C) is split into '
      'layer budgets C_h: uniform (C/sqrt(H)) or dim (C sqrt(d_h/sum d)); '
      'the library also takes per-layer weights or ExplicitBudgets.', 'dim',
      SPLITS)
  denominator: str = _parameter(
      'What the noisy sum is divided by: expected (n: unbiased, the private '
      'choice) or actual (the clients present, released in the clear: '
      'private only when the cohort size is public, i.e. under fixed-size '
      'sampling).', 'expected', DENOMINATORS)
  initial_clip_norm: float = _parameter(
      'Adaptive clipping: the starting C (Andrew et al. 2021: 0.1).', 0.1)
  target_quantile: Optional[float] = _parameter(
      'Adaptive clipping: gamma in [0, 1], the fraction of clients left '
      'unclipped. None: follow the noise (tff_clip.aggregation.noise_following, '
      'from z, n and the model\'s size: the median where the noise on the '
      'mean update is small next to C, moving to 0.1 after round 20 if C has '
      'doubled since round 10; 0.1 where the noise is larger, 0.03 where it '
      'dominates).', None)
  clip_learning_rate: float = _parameter(
      'Adaptive clipping: eta_C > 0, the learning rate of the geometric '
      'update C <- C exp(-eta_C (b - gamma)).', 0.2)
  clipped_count_stddev: Optional[float] = _parameter(
      'Adaptive clipping: sigma_b > 0, the std of the noise on the clipped '
      'count (default: n/20, raised where needed so the value noise grows by '
      'at most 10%; unused when z = 0).', None)
  per_layer_quantiles: bool = _parameter(
      'Per-layer adaptive clipping: True gives every layer its own norm C_h, '
      'starting at `initial_clip_norm`/sqrt(H) and tracking its own quantile '
      '(`split` then plays no part); False moves one C split by `split`.',
      True)
  noise_placement: str = _parameter(
      'central: the server adds N(0, (z S)^2) to the sum; client: each '
      'client adds N(0, (z S)^2 / n), the same noise in total when n clients '
      'take part, less when fewer do (Zhang et al. 2022, Pelikan et al. '
      '2025).', 'central', NOISE_PLACEMENTS)
  noise_seed: Optional[int] = _parameter(
      'Seed of the DP noise, for tests and debugging ONLY: the noise is then '
      'reproducible, predictable, and NOT private (client noise is then a '
      'function of the seed, the round and the bounded record: clients of '
      'identical records draw identical noise). None: a fresh key from OS '
      'entropy, kept only in the aggregator state (checkpoints).',
      None)
  noise_mechanism: str = _parameter(
      'How the DP noise of successive rounds is correlated. '
      f'{_noise_mechanisms_help()}. Correlated noise needs central noise '
      'and participation with minimum separation at least `bands` '
      '(`sampling`=min_separation; docs/correlated_noise.md); each round '
      'then records the event of one participation. The adaptive norm\'s '
      'count noise stays independent.', 'independent',
      mechanisms.NOISE_MECHANISMS.names)
  bands: int = _parameter(
      'b >= 1, the memory of correlated noise: the bands of banded noise '
      '(1: independent noise), the restart period of tree noise.', 1)
  rounds: Optional[int] = _parameter(
      'T, the rounds of the run (None: not known), for a noise mechanism '
      'whose noise or sensitivity depends on it.', None)
  min_separation: Optional[int] = _parameter(
      'The minimum separation of participation: each client takes part at '
      'most once every `min_separation` rounds (None: sampling without '
      'one). At least `bands`.', None)
  blt_buffers: int = _parameter(
      'BLT noise: the most model-sized buffers of its state (1 to '
      f'{blt.MAX_BUFFERS}); the optimizer adds one only while it lowers the '
      'error by 0.1% (`tff_clip.aggregation.blt.optimize`).', blt.DEFAULT_BUFFERS)

  def __post_init__(self):
    def put(name, value):
      object.__setattr__(self, name, value)

    put('_bounding', mechanisms.bounding(self.bounding_method, 'bounding'))
    z = self.noise_multiplier  # 0 and -0.0 alike: no noise (documented).
    z = checks.nonnegative_float(
        0.0 if checks.is_real(z) and z == 0 else z, 'noise_multiplier')
    if 0 < z < checks.FLOAT32_TINY:
      # Above it, epsilon stays finite (dp_accounting's RDP of one round,
      # about 1/z^2, overflows float64 only below z = 1e-154).
      raise ValueError(
          f'`noise_multiplier` = {z!r} is subnormal in float32 (below '
          f'{checks.FLOAT32_TINY:.3g}), where TensorFlow flushes it to 0: '
          'no noise would be added while the ledger accounts z. Give z >= '
          f'{checks.FLOAT32_TINY:.3g}.')
    put('noise_multiplier', z)
    put('clients_per_round', checks.positive_float(self.clients_per_round,
                                                   'clients_per_round'))
    if isinstance(self.clip_norm, str):
      if self.clip_norm != 'adaptive':
        raise ValueError("`clip_norm` must be a positive float or 'adaptive';"
                         f' got {self.clip_norm!r}.')
    else:
      put('clip_norm', checks.normal_float(
          checks.positive_float(self.clip_norm, 'clip_norm'), 'clip_norm'))
    # The adaptive knobs are checked even for a fixed clip_norm: a bad value
    # is a mistake whether or not this run reads it.
    put('initial_clip_norm', checks.normal_float(
        checks.positive_float(self.initial_clip_norm, 'initial_clip_norm'),
        'initial_clip_norm'))
    if self.target_quantile is not None:
      put('target_quantile', checks.probability(
          self.target_quantile, 'target_quantile', low_open=False,
          high_open=False))
    put('clip_learning_rate', checks.positive_float(self.clip_learning_rate,
                                                    'clip_learning_rate'))
    per_layer_quantiles = checks.boolean(self.per_layer_quantiles,
                                         'per_layer_quantiles')
    put('per_layer_quantiles', per_layer_quantiles)
    if self.clipped_count_stddev is not None:
      put('clipped_count_stddev', checks.positive_float(
          self.clipped_count_stddev, 'clipped_count_stddev'))
    if self.per_layer:
      check_split(self.split)
      if isinstance(self.split, ExplicitBudgets) and self.adaptive:
        raise ValueError('`split`: explicit budgets need a fixed `clip_norm`.')
    checks.one_of(self.denominator, 'denominator', DENOMINATORS)
    checks.one_of(self.noise_placement, 'noise_placement', NOISE_PLACEMENTS)
    # Checked whichever mechanism reads it.
    put('blt_buffers', checks.integer(self.blt_buffers, 'blt_buffers', 1,
                                      blt.MAX_BUFFERS))
    noise = self.noise_under(self.min_separation)
    noise.check_placement(self.noise_placement)
    noise.check_bounding(self.bounding)
    put('_noise', noise)
    put('bands', noise.bands)
    put('rounds', noise.rounds)
    put('min_separation', noise.separation)
    if self.noise_seed is not None:  # An int64 key; the count noise: seed + 1.
      put('noise_seed', checks.integer(self.noise_seed, 'noise_seed',
                                       maximum=checks.INT64_MAX - 1))
    # With one count (the number of layers is not known here) the noise
    # split must be feasible; per-layer counts (z_v >= z) are checked again
    # at `create`, when the layers are known.
    value_z = z
    if self.adaptive and not (self.per_layer and per_layer_quantiles):
      value_z, _ = noise_following.noise_split(
          z, self.clients_per_round, self.clipped_count_stddev,
          sensitivity=noise_following.split_sensitivity(noise))
    self.check_noise_scale(value_noise_multiplier=value_z)

  def check_noise_scale(self, dtypes=(np.float32,),
                        value_noise_multiplier: Optional[float] = None,
                        budgets=None) -> None:
    """Refuses a mechanism whose own numbers its dtypes cannot hold.

    Each argument alone may be fine while a product the mechanism computes
    is not, so these are checked where they are computed: the noise std
    z S, drawn in float32 (S the L2 sensitivity: C, or the initial C of
    adaptive clipping; with client noise, each client's z S / sqrt(n)) must
    be at least `MIN_NOISE_STDDEV` (TensorFlow flushes subnormals to 0: no
    noise); the
    noisy sum of n records bounded by S, (n + 10 z) S, must fit the dtype it
    is summed in (float32, float64 for float64 leaves), and the noisy mean,
    S (1 + 10 z / n), each leaf's dtype it is cast back to (float16: 65504),
    where its noise z S / n must not round to 0. Ten standard deviations:
    P(|N(0, 1)| > 10) = 1.5e-23 per coordinate. A per-layer budget C_h in
    `budgets` must be a normal float32 (or 0). Called when the spec is made
    (float32) and by `create` with the update's leaf dtypes, the adaptive
    value noise z_v (`value_noise_multiplier`, default z) and the budgets.
    An adaptive C is checked at its start; the query keeps it from falling
    below that least noise later (`BoundedGaussianSumQuery.least_clip_norm`)
    or rising past these ranges (`greatest_norm`).
    """
    z = (self.noise_multiplier if value_noise_multiplier is None else
         float(value_noise_multiplier))
    n = self.clients_per_round
    norm_name = 'initial_clip_norm' if self.adaptive else 'clip_norm'
    norm = getattr(self, norm_name)
    tail = NOISE_TAIL_STDDEVS
    given = (f'`{norm_name}` = {norm:g}, `noise_multiplier` = '
             f'{self.noise_multiplier:g} and `clients_per_round` = {n:g}')
    fix = f'lower `{norm_name}` or `noise_multiplier`'
    f32 = np.finfo(np.float32)
    for h, budget in enumerate(np.ravel([] if budgets is None else budgets)):
      if 0 < budget < f32.tiny:
        raise ValueError(
            f'`split`: layer {h} gets the budget C_h = {budget:.3g}, subnormal '
            f'in float32 (below {f32.tiny:.3g}), where TensorFlow flushes it '
            f'to 0; raise `{norm_name}` or use split=\'uniform\'.')
    if z > 0:
      stddev = z * norm / (math.sqrt(n) if self.noise_placement == 'client'
                           else 1.0)
      if stddev < MIN_NOISE_STDDEV:
        raise ValueError(
            f'{given}: the noise std {stddev:.3g} is below '
            f'{MIN_NOISE_STDDEV:.3g} (2^24 times float32\'s least normal '
            'number), where TensorFlow flushes its products to 0: no noise '
            f'would be added. Raise `noise_multiplier` or `{norm_name}`.')
    for dtype in map(np.dtype, dtypes):
      sum_dtype = np.dtype(np.float64 if dtype == np.float64 else np.float32)
      noisy_sum = (n + tail * z) * norm
      if tail * z * norm > f32.max or noisy_sum > np.finfo(sum_dtype).max:
        raise ValueError(
            f'{given}: the noisy sum reaches (n + {tail:g} z) S = '
            f'{noisy_sum:.3g}, beyond {sum_dtype.name}\'s max '
            f'{np.finfo(sum_dtype).max:.3g} (the aggregate would be inf or '
            f'NaN); {fix}.')
      noisy_mean = norm * (1.0 + tail * z / n)
      largest = _largest(dtype)
      if noisy_mean > largest:
        raise ValueError(
            f'{given}: the noisy mean reaches S (1 + {tail:g} z / n) = '
            f'{noisy_mean:.3g}, beyond {dtype.name}\'s max '
            f'{largest:.6g}, the dtype of the update it is cast '
            f'back to (it would come out inf); {fix}, raise '
            '`clients_per_round`, or aggregate float32 updates.')
      with np.errstate(under='ignore'):
        rounded = float(np.asarray(z * norm / n, dtype))
      if z > 0 and rounded == 0:
        raise ValueError(
            f'{given}: the noise on the mean, z S / n = {z * norm / n:.3g}, '
            f'rounds to 0 in {dtype.name}, the dtype of the update: it would '
            f'be released without noise. Raise `noise_multiplier` or '
            f'`{norm_name}`, or lower `clients_per_round`.')

  @property
  def adaptive(self) -> bool:
    """True when the clip norm tracks a quantile of the client norms."""
    return isinstance(self.clip_norm, str)

  @property
  def per_layer(self) -> bool:
    """True when every layer is bounded by its own budget C_h."""
    return self.bounding.per_layer

  @property
  def bounding(self):
    """The bounding `bounding_method` names (`tff_clip.aggregation.boundings`)."""
    return self._bounding

  @property
  def noise(self):
    """The noise mechanism (`tff_clip.aggregation.noise_mechanisms`) for `bands`,
    `rounds` and `min_separation`: the one object whose noise the factory adds
    and whose events the ledger records."""
    return self._noise

  def noise_under(self, separation: Optional[int]):
    """The noise mechanism of these parameters for participation with
    minimum `separation` (e.g. an audit's canaries')."""
    return mechanisms.noise_mechanism_from(
        {name: getattr(self, name) for name in PARAMETERS}, separation)


PARAMETERS = tuple(field.name for field in dataclasses.fields(DPSpec))

# Parameters a DPSpec reads only in some configurations: (name, whether
# `spec` reads it, where it applies). Given where it is not read, it would
# change nothing while its caller believes it did (`unread`).
_ADAPTIVE = 'an adaptive clip_norm'
_APPLIES = (
    ('initial_clip_norm', lambda s: s.adaptive, _ADAPTIVE),
    ('target_quantile', lambda s: s.adaptive, _ADAPTIVE),
    ('clip_learning_rate', lambda s: s.adaptive, _ADAPTIVE),
    ('clipped_count_stddev', lambda s: s.adaptive, _ADAPTIVE),
    ('bands', lambda s: s.noise.correlated,
     'correlated noise (noise_mechanism)'),
    ('blt_buffers', lambda s: 'blt_buffers' in s.noise.options,
     'noise_mechanism blt'),
    # Per-layer quantiles give every layer its own norm: nothing to split.
    ('split', lambda s: s.per_layer and not (s.adaptive and
                                              s.per_layer_quantiles),
     'a per_layer_ bounding of one norm (fixed, or per_layer_quantiles '
     'False)'),
)


def unread(dp_spec: DPSpec, given) -> Optional[tuple[str, str]]:
  """(name, where it applies) of the first parameter of `given` (names)
  that `dp_spec` does not read, else None. `dp_factory` and `scripts.train`
  refuse it."""
  for name, reads, where in _APPLIES:
    if name in given and not reads(dp_spec):
      return name, where
  return None


def parameter(name: str) -> dataclasses.Field:
  """The declaration of DP parameter `name`: `default` (MISSING when the
  parameter is required) and `metadata` `help` and `choices`."""
  fields = {field.name: field for field in dataclasses.fields(DPSpec)}
  return fields[checks.one_of(name, 'name', PARAMETERS)]


def parameters_doc(indent: str = '    ') -> str:
  """The DP parameters as a docstring's Args section (generated)."""
  import textwrap  # pylint: disable=g-import-not-at-top
  lines = []
  for name in PARAMETERS:
    field = parameter(name)
    default = ('' if field.default is dataclasses.MISSING else
               f' Default: {field.default!r}.')
    lines.extend(textwrap.wrap(
        f'{name}: {field.metadata["help"]}{default}', 78 - len(indent),
        initial_indent=indent, subsequent_indent=indent + '  '))
  return '\n'.join(lines)


# ----------------------------------------------------------------------------
# Client algorithms (`tff_clip.learning.client`, `tff_clip.learning.algorithms`).

Sparsity = Union[float, Sequence[float]]


def _check_sparsity_value(value, label: str) -> float:
  if not checks.is_real(value):
    raise TypeError(
        f'`{label}` must be a float in [0, 1) or one such float per layer; '
        f'got {value!r}.')
  if not 0 <= value < 1:  # Also rejects NaN.
    raise ValueError(
        f'`{label}` must be in [0, 1) (the fraction c = 1 - s/d of update '
        f'entries zeroed; c = 1 would send nothing); got {value!r}.')
  return float(value)


def check_sparsity(sparsity: Sparsity, label: str = 'lus_sparsity'):
  """LUS sparsity c: a float in [0, 1), or a tuple of them (one per layer)."""
  if isinstance(sparsity, (str, bytes)):
    raise TypeError(
        f'`{label}` must be a float in [0, 1) or one such float per layer; '
        f'got {sparsity!r}.')
  if isinstance(sparsity, (Sequence, np.ndarray)):
    values = tuple(
        _check_sparsity_value(v, label) for v in np.asarray(
            sparsity, dtype=object).reshape(-1))
    if not values:
      raise ValueError(f'`{label}` is an empty sequence; give one per layer.')
    return values
  return _check_sparsity_value(sparsity, label)


def _clip_norm(value, label: str) -> float:
  """A positive finite clip norm, normal in float32: TensorFlow flushes a
  subnormal one to 0, which would clip everything to nothing."""
  return checks.normal_float(checks.positive_float(value, label), label)


def check_client_arguments(*,
                           blur_strength=None,
                           blur_clip_norm=None,
                           lus_sparsity=None,
                           model_clip_norm=None,
                           local_clip_norm=None,
                           client_learning_rate: Optional[float] = None
                          ) -> None:
  """Raises for bad client-algorithm arguments (see `tff_clip.learning.algorithms`).

  `client_learning_rate` (eta_l), when known, checks BLUR's condition
  lambda < 1 / eta_l (Cheng et al. 2022, Lemma 2).
  """
  if local_clip_norm is not None:
    if checks.is_real(local_clip_norm) and math.isinf(local_clip_norm) and (
        local_clip_norm > 0):
      raise ValueError(
          '`local_clip_norm` = inf: for no per-step clipping pass None.')
    _clip_norm(local_clip_norm, 'local_clip_norm')
  if blur_strength is None:
    if blur_clip_norm is not None:
      raise ValueError(
          '`blur_clip_norm` is given but `blur_strength` is None; BLUR needs '
          'both (or neither).')
  else:
    strength = checks.positive_float(blur_strength, 'blur_strength')
    if blur_clip_norm is None:
      raise ValueError(
          '`blur_clip_norm` is required with `blur_strength`: it is S in the '
          'BLUR penalty max(0, ||w - w_t||^2 - S^2), the clip norm of the DP '
          'bound the update will go through.')
    _clip_norm(blur_clip_norm, 'blur_clip_norm')
    # Lemma 2: a step outside the ball scales w - w_t by (1 - lambda eta);
    # with lambda >= 1/eta it stops shrinking (=) or flips sign (>) instead
    # of pulling w back towards w_t.
    if client_learning_rate is not None and (
        strength * client_learning_rate >= 1):
      raise ValueError(
          f'`blur_strength` = {blur_strength!r} must be < 1 / '
          f'client_learning_rate = 1 / {client_learning_rate!r} (Cheng et '
          'al. 2022, Lemma 2: lambda < 1/eta_l, else the penalty step '
          'overshoots w_t).')
  if lus_sparsity is not None:
    check_sparsity(lus_sparsity)
  if model_clip_norm is not None:
    _clip_norm(model_clip_norm, 'model_clip_norm')
    if blur_strength is not None or lus_sparsity is not None:
      raise ValueError(
          '`model_clip_norm` (model clipping, a baseline that sends clipped '
          'models, not updates) cannot be combined with `blur_strength` or '
          '`lus_sparsity`, which shape the update.')
