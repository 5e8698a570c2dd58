"""How a round's DP noise is drawn, accounted and audited: one object each.

A noise mechanism adds s_t n_t to round t's sum of bounded records, s_t =
z S_t the noise scale (S_t the round's L2 sensitivity) and n_t unit-variance
noise whose correlation across rounds is the mechanism's. The mechanism owns
everything that depends on it, so that no other module asks for its name:

  * its validity: the noise placement it allows (`check_placement`), the
    boundings it supports (`check_bounding`) and the participation it needs
    (`check_participation`: correlated noise is private only when each
    client takes part at most once every `separation` rounds);
  * its part of the aggregator state (`initial_state`) and round t's unit
    noise, drawn from the run's secret key (`unit_noise`);
  * what one participation costs (`participation_event`) and what `rounds`
    rounds cost under minimum separation (`training_event`): the DpEvents
    the ledger and the calibration compose;
  * the audit's whitening weights (`whitening_weights`,
    `whitening_depth`);
  * the covariance of its unit noise across rounds (`noise_covariance`,
    numpy: what the tests check the streams against).

`tff_clip.aggregation.dp.BoundedGaussianSumQuery` adds `unit_noise` and records
`participation_event` of one object, so the noise added and the event
accounted come from the same place. The mechanisms are registered by their
public names in `tff_clip.aggregation.mechanisms`: a new one is a subclass and one line
there. This module holds the base class and independent noise; banded and
tree noise are in `tff_clip.aggregation.correlated_noise`.

No TensorFlow or dp_accounting import at module level (they load inside the
methods that need them): the command line checks its flags with these
classes before either is imported.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from tff_clip import checks

__all__ = ['Independent', 'NoiseMechanism', 'check_bands_within_separation',
           'fold', 'gaussian_event',
           'participations', 'standard_normals']


def participations(rounds: int, separation: int) -> int:
  """k = ceil(T / b): the most rounds a client can take part in."""
  return -(-int(rounds) // int(separation))


def check_bands_within_separation(bands: int, separation: int) -> None:
  """Refuses `bands` above the participation `separation`."""
  if separation < bands:
    # Within `bands` rounds two participations would share the
    # mechanism's memory: the per-participation accounting breaks.
    raise ValueError(
        f'`bands` ({bands}) must be at most the participation '
        f'`separation` ({separation}): a client taking part twice '
        f'within {bands} rounds is not covered by the accounting; '
        'raise the separation or lower `bands`.')


def gaussian_event(noise_multiplier):
  """`dp_accounting.GaussianDpEvent(noise_multiplier)` (z may be a tensor)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  return dp_accounting.GaussianDpEvent(noise_multiplier)


def fold(key, *data):
  """`key` folded with every value of `data` in turn (stateless keys)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for value in data:
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(value,
                                                                tf.int64))
  return key


def standard_normals(structure, key):
  """N(0, 1) float32 draws of `structure`'s shapes: leaf i from fold(key, i)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.nest.pack_sequence_as(structure, [
      tf.random.stateless_normal(tf.shape(leaf), fold(key, i),
                                 dtype=tf.float32)
      for i, leaf in enumerate(tf.nest.flatten(structure))])


def noise_history(template, depth: int):
  """`depth` past float32 noise vectors per leaf of `template`, all zero."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.nest.map_structure(
      lambda spec: tf.zeros([depth] + list(spec.shape), tf.float32), template)


class NoiseMechanism:
  """The base of every noise mechanism (see the module docstring).

  A subclass sets `name` (its public name, the registry's key) and
  `correlated`, and implements `unit_noise`, `participation_sensitivity`,
  `whitening_weights` and `noise_covariance`; the checks, the state and the
  events have defaults built on those.

  Args:
    bands: b >= 1, the size of a correlated mechanism's memory (its
      meaning is the mechanism's: see its class).
    rounds: T, the rounds of the run, or None if not known. A mechanism
      whose noise or sensitivity depends on the run's length reads it.
    separation: the minimum separation of participation (each client takes
      part at most once every `separation` rounds), or None for sampling
      without one. Must be at least `bands`.
  """

  name: str = ''
  # True when a round's noise depends on other rounds' noise: then the
  # mechanism is private only under participation with minimum separation,
  # and only the server (which keeps the past noise) can add it.
  correlated: bool = False
  # Model-sized float32 vectors the mechanism keeps in the aggregator state
  # (its memory need, checkpointed every round).
  state_vectors: int = 0
  # Past released aggregates the audit combines with the current one
  # (`whitening_weights` has whitening_depth + 1 entries).
  whitening_depth: int = 0
  # True when `bands` shapes the noise (and the state): its memory in rounds.
  uses_bands: bool = False
  # The flags that shrink its state, named when the state does not fit in
  # memory (`tff_clip.program.assembly`).
  smaller_state_flags: str = '--bands, --noise_mechanism=blt'
  # Keyword arguments of its own (besides bands, rounds and separation) that
  # `tff_clip.aggregation.mechanisms.noise_mechanism` passes on, e.g. 'blt_buffers'.
  options: tuple = ()

  def __init__(self, bands: int = 1, *, rounds: Optional[int] = None,
               separation: Optional[int] = None):
    self.bands = checks.integer(bands, 'bands', minimum=1)
    self.rounds = (None if rounds is None else
                   checks.integer(rounds, 'rounds', minimum=1))
    self.separation = (None if separation is None else
                       checks.integer(separation, 'separation', minimum=1))
    if self.separation is not None:
      check_bands_within_separation(self.bands, self.separation)

  def __repr__(self):
    return (f'{type(self).__name__}(bands={self.bands}, rounds={self.rounds}'
            f', separation={self.separation})')

  # -- validity ---------------------------------------------------------------

  def check_placement(self, noise_placement: str) -> None:
    """Raises unless the mechanism can be added at `noise_placement`."""
    if self.correlated and noise_placement != 'central':
      raise ValueError(
          f'`noise_mechanism`={self.name} needs `noise_placement`=central: '
          'noise correlated across rounds is drawn from the past noise, '
          'which only the server keeps.')

  def check_bounding(self, bounding) -> None:
    """Raises unless the mechanism supports `bounding` (a
    `tff_clip.aggregation.boundings.Bounding`); every mechanism here supports all."""
    del bounding

  def check_participation(self) -> None:
    """Raises unless the run's participation makes the mechanism private."""
    if self.correlated and self.separation is None:
      raise ValueError(
          f'`noise_mechanism`={self.name} needs `sampling`=min_separation: '
          'noise correlated across rounds is accounted per participation '
          '(each client at most once every `separation` rounds), without '
          'amplification by sampling.')

  # -- state and noise (TensorFlow) ------------------------------------------

  def initial_state(self, template):
    """The mechanism's part of the aggregator state, for records shaped like
    `template` (tensor specs); None when it keeps none."""
    del template
    return None

  def unit_noise(self, structure, key, round_num, state):
    """(round `round_num`'s unit-variance float32 noise, the new state).

    `structure`: tensors giving the shapes; `key`: the run's secret [2]
    int64 key; `state`: `initial_state`'s structure (None if it keeps none).
    The caller scales the noise by z S_t.
    """
    raise NotImplementedError

  # -- accounting -------------------------------------------------------------

  @property
  def participation_sensitivity(self) -> float:
    """The L2 sensitivity of one participation's noisy releases, in units of
    the per-round sensitivity S: z over it is the noise multiplier of the
    Gaussian mechanism one participation is."""
    raise NotImplementedError

  def record(self):
    """What the noise runs beyond its flags, as a run records it (JSON), or
    None where the flags fix it: a resumed run compares it, so that it
    never pairs its state with noise of another factorization."""
    return None

  def participation_event(self, noise_multiplier):
    """The `DpEvent` of one participation, for noise multiplier z (a float
    or a tensor: the query records it from its state)."""
    if isinstance(noise_multiplier, (int, float, np.number)):
      noise_multiplier = float(noise_multiplier)
    sensitivity = self.participation_sensitivity
    if sensitivity != 1:
      noise_multiplier = noise_multiplier / sensitivity
    return gaussian_event(noise_multiplier)

  @property
  def participations(self) -> int:
    """k = ceil(T / b), the most participations of one client."""
    if self.rounds is None or self.separation is None:
      raise ValueError(f'`noise_mechanism`={self.name}: the participations '
                       'need `rounds` and `separation`.')
    return participations(self.rounds, self.separation)

  def training_event(self, noise_multiplier: float):
    """`rounds` rounds under minimum separation: k = ceil(T / b)
    participations, each `participation_event` (no amplification)."""
    import dp_accounting  # pylint: disable=g-import-not-at-top
    if self.separation is None:
      raise ValueError(f'`noise_mechanism`={self.name}: a training event '
                       'under minimum separation needs `separation`.')
    return dp_accounting.SelfComposedDpEvent(
        self.participation_event(noise_multiplier), self.participations)

  # -- audit and oracles ------------------------------------------------------

  def whitening_weights(self, round_num):
    """a_0..a_depth (float32 tensor) such that sum_j a_j Delta_{t-j} of the
    released aggregates Delta carries noise independent across rounds
    (`tff_clip.privacy.audit`); `round_num` may be a tensor."""
    raise NotImplementedError

  def noise_covariance(self, rounds: int) -> np.ndarray:
    """[rounds, rounds] covariance of the unit noise across rounds."""
    raise NotImplementedError


class Independent(NoiseMechanism):
  """Fresh Gaussian noise every round (DP-FedAvg; McMahan et al. 2018)."""

  name = 'independent'

  def unit_noise(self, structure, key, round_num, state):
    return standard_normals(structure, fold(key, round_num)), state

  participation_sensitivity = 1.0

  def whitening_weights(self, round_num):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    del round_num
    return tf.ones([1], tf.float32)

  def noise_covariance(self, rounds: int) -> np.ndarray:
    return np.eye(rounds)
