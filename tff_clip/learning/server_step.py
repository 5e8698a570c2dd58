"""Server steps that follow the updates they receive.

Each wraps any TFF optimizer with a learning rate and scales that learning
rate from the aggregate updates alone, which a DP round releases anyway, so
neither costs privacy budget (`--server_step`, docs/frontier_history_2.md
"A server step that follows the updates"):

* `oscillation_damped(inner_optimizer)` halves it when the cosine between
  consecutive updates, averaged over rounds, falls further below zero than
  noise would take it (tff_clip's default server step in DP runs);
* `growth_held(inner_optimizer)` keeps the step's norm from growing past
  the smallest update norm seen since a warm-up.

Reference: Chee, Toulis, "Convergence diagnostics for stochastic gradient
descent with constant learning rate", AISTATS 2018 (after Pflug 1983, "On
the determination of the step size in stochastic quasigradient methods").
"""

from __future__ import annotations

import collections
import collections.abc
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip import checks

__all__ = ['growth_held', 'oscillation_damped', 'step_scale']

_Optimizer = tff.learning.optimizers.Optimizer
_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY

_SCALE_KEY = 'learning_rate_scale'
_COSINE_AVERAGE_KEY = 'cosine_average'
_PREVIOUS_KEY = 'previous_gradient'
_INNER_KEY = 'inner'
_ROUND_KEY = 'round'
_FLOOR_KEY = 'update_norm_floor'
_HOLD_KEY = 'hold_scale'


def _global_dot(a, b):
  """sum_h <a_h, b_h> in float64. In float32 the square of a norm overflows
  above 1.8e19 and flushes to 0 below 1e-19, and the cosine's product of
  two squares does so at norms above 4e9 and below 3e-10: the cosine and
  the norm read here are scale-free."""
  wide = lambda x: tf.cast(x, tf.float64)
  return tf.add_n([tf.reduce_sum(wide(x) * wide(y)) for x, y in zip(a, b)]
                  or [tf.constant(0.0, tf.float64)])


class _ScaledLearningRate(_Optimizer):
  """Runs `inner_optimizer` at its learning rate times a multiplier that a
  subclass's `_multiplier` computes each round from the update received."""

  def __init__(self, inner_optimizer):
    self._inner = inner_optimizer

  @property
  def inner_optimizer(self) -> _Optimizer:
    return self._inner

  def _initial(self, specs) -> dict:
    """The subclass's own state entries."""
    raise NotImplementedError

  def _multiplier(self, state, g, present):
    """(this round's multiplier, the subclass's new state entries): `g` the
    update's non-None leaves as float32, `present` their flat indices."""
    raise NotImplementedError

  def initialize(self, specs):
    inner = self._inner.initialize(specs)
    state = collections.OrderedDict(self._inner.get_hparams(inner))
    state[_INNER_KEY] = inner
    state.update(self._initial(specs))
    return state

  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
        gradients)
    flat_g = tf.nest.flatten(gradients)
    present = [i for i, leaf in enumerate(flat_g) if leaf is not None]
    g = [tf.cast(flat_g[i], tf.float32) for i in present]
    multiplier, own = self._multiplier(state, g, present)
    hparams = self.get_hparams(state)
    learning_rate = hparams[_LEARNING_RATE_KEY]
    hparams[_LEARNING_RATE_KEY] = learning_rate * tf.cast(
        multiplier, tf.convert_to_tensor(learning_rate).dtype)
    inner, weights = self._inner.next(
        self._inner.set_hparams(state[_INNER_KEY], hparams), weights,
        gradients)
    new_state = collections.OrderedDict(state)
    new_state[_INNER_KEY] = inner
    new_state.update(own)
    return new_state, weights

  def get_hparams(self, state):
    return collections.OrderedDict(
        (key, state[key]) for key in self._inner.get_hparams(state[_INNER_KEY]))

  def set_hparams(self, state, hparams):
    keys = tuple(self._inner.get_hparams(state[_INNER_KEY]))
    unknown = [key for key in hparams if key not in keys]
    if unknown:
      raise KeyError(f'Unknown hyperparameters {unknown}; this optimizer has '
                     f'{list(keys)}.')
    updated = collections.OrderedDict(state)
    updated.update(hparams)
    return updated


class _OscillationDamped(_ScaledLearningRate):
  """See `oscillation_damped`."""

  def __init__(self, inner_optimizer, threshold, decay, factor):
    super().__init__(inner_optimizer)
    self._threshold = float(threshold)
    self._decay = float(decay)
    self._factor = float(factor)

  def _initial(self, specs):
    return {_SCALE_KEY: tf.constant(1.0),
            _COSINE_AVERAGE_KEY: tf.constant(0.0),
            _PREVIOUS_KEY: tf.nest.map_structure(
                lambda s: tf.zeros(s.shape, tf.float32), specs)}

  def _multiplier(self, state, g, present):
    flat_p = tf.nest.flatten(state[_PREVIOUS_KEY])
    p = [flat_p[i] for i in present]
    dimension = float(sum(int(np.prod(x.shape)) for x in g))
    cosine = tf.math.divide_no_nan(
        _global_dot(g, p), tf.sqrt(_global_dot(g, g) * _global_dot(p, p)))
    # A non-finite update (which the aggregators zero) is no evidence.
    cosine = tf.cast(tf.where(tf.math.is_finite(cosine), cosine, 0.0),
                     tf.float32)
    average = (self._decay * state[_COSINE_AVERAGE_KEY] +
               (1.0 - self._decay) * cosine)
    # Two independent isotropic vectors in R^d have cosine ~ N(0, 1/d); its
    # exponential average with decay b has standard deviation
    # sqrt((1 - b) / (1 + b) / d).
    limit = -self._threshold * np.sqrt(
        (1.0 - self._decay) / (1.0 + self._decay) / max(dimension, 1.0))
    oscillating = average < limit
    scale = tf.where(oscillating, state[_SCALE_KEY] * self._factor,
                     state[_SCALE_KEY])
    for k, i in enumerate(present):
      flat_p[i] = g[k]
    return scale, {
        _SCALE_KEY: scale,
        _COSINE_AVERAGE_KEY: tf.where(oscillating, 0.0, average),
        _PREVIOUS_KEY: tf.nest.pack_sequence_as(state[_PREVIOUS_KEY], flat_p)}


class _GrowthHeld(_ScaledLearningRate):
  """See `growth_held`."""

  def __init__(self, inner_optimizer, warmup_rounds):
    super().__init__(inner_optimizer)
    self._warmup_rounds = int(warmup_rounds)

  def _initial(self, specs):
    del specs  # Unused.
    return {_ROUND_KEY: tf.constant(0, tf.int32),
            _FLOOR_KEY: tf.constant(np.inf, tf.float32),
            _HOLD_KEY: tf.constant(1.0)}

  def _multiplier(self, state, g, present):
    del present  # Unused.
    round_num = state[_ROUND_KEY] + 1
    norm = tf.cast(tf.sqrt(_global_dot(g, g)), tf.float32)
    # A non-finite or zero update (which the aggregators zero) is no evidence.
    evidence = tf.math.is_finite(norm) & (norm > 0.0)
    floor = tf.where(evidence & (round_num >= self._warmup_rounds),
                     tf.minimum(state[_FLOOR_KEY], norm), state[_FLOOR_KEY])
    hold = tf.where(evidence & tf.math.is_finite(floor),
                    tf.minimum(1.0, floor / tf.where(evidence, norm, 1.0)),
                    1.0)
    return hold, {_ROUND_KEY: round_num, _FLOOR_KEY: floor, _HOLD_KEY: hold}


def _check_inner(inner_optimizer):
  if not isinstance(inner_optimizer, _Optimizer):
    raise TypeError('`inner_optimizer` must be a '
                    '`tff.learning.optimizers.Optimizer`; got '
                    f'{type(inner_optimizer).__name__}.')
  # The step scales the learning rate among its hyperparameters: one held
  # elsewhere (TFF's `schedule_learning_rate` keeps it in its own state)
  # would fail the first round, inside the server's computation.
  state = inner_optimizer.initialize([tf.TensorSpec([1], tf.float32)])
  if _LEARNING_RATE_KEY not in inner_optimizer.get_hparams(state):
    raise ValueError(
        '`inner_optimizer` has no `learning_rate` hyperparameter to scale '
        f'(e.g. a scheduled optimizer); got {type(inner_optimizer).__name__}. '
        'Schedule the damped optimizer instead.')


def oscillation_damped(inner_optimizer: _Optimizer,
                       threshold: float = 3.0,
                       decay: float = 0.8,
                       factor: float = 0.5) -> _Optimizer:
  """Shortens an optimizer's step when consecutive updates point apart.

  Pflug's diagnostic for stochastic approximation (Pflug 1983; Chee and
  Toulis, AISTATS 2018, Algorithm 1): past the transient, a step too long
  for the loss makes consecutive gradients anti-correlated, and halving the
  learning rate then is what restores progress. Here, on the server: each
  round the cosine c_t between this round's update g_t (the aggregate the
  optimizer receives) and the previous one enters an exponential average
  a_t = decay a_{t-1} + (1 - decay) c_t, and when a_t falls below
  -threshold sqrt((1 - decay) / ((1 + decay) d)) the learning rate is
  multiplied by `factor` and the average restarts at 0. That limit is
  `threshold` standard deviations of the average under the null of two
  independent isotropic vectors in R^d (cosine ~ N(0, 1/d)): the Gaussian
  noise of a DP aggregate alone, or an update with no common direction,
  almost never crosses it, whatever the noise multiplier, so a run whose
  updates are noise keeps its learning rate. That null holds for noise
  independent across rounds only: correlated noise (banded, BLT, tree) is
  anti-correlated between consecutive rounds by design and crosses the
  limit every few rounds (tests/test_server_step.py), so tff_clip's runs
  keep a fixed step there (`--server_step=auto`) and refuse this one.

  With DP noise the update it reads is the noised aggregate, which the
  round releases anyway: the damping is post-processing and costs no
  privacy budget (the ledger is the same with or without it).

  The state holds `inner_optimizer`'s hyperparameters (whose learning rate
  stays the one given: `schedule_learning_rate` and `set_hparams` change it
  as for the inner optimizer), the inner state, the learning-rate scale
  (`learning_rate_scale`, 1 until the first halving), the running average of
  the cosine and the previous update.

  Args:
    inner_optimizer: a `tff.learning.optimizers.Optimizer` with a
      `learning_rate` hyperparameter (SGD(M), Adam, LAMB, LARS, ...).
    threshold: a positive float, standard deviations of the null average.
    decay: the average's decay, in [0, 1).
    factor: the learning rate's multiplier on each detection, in (0, 1).

  Returns:
    A `tff.learning.optimizers.Optimizer`.

  Raises:
    TypeError: if `inner_optimizer` is not a TFF optimizer.
    ValueError: if an argument is out of range, or `inner_optimizer` has no
      learning rate.
  """
  _check_inner(inner_optimizer)
  checks.positive_float(threshold, 'threshold')
  checks.probability(decay, 'decay', low_open=False)
  checks.probability(factor, 'factor')
  return _OscillationDamped(inner_optimizer, threshold, decay, factor)


def growth_held(inner_optimizer: _Optimizer,
                warmup_rounds: int = 10) -> _Optimizer:
  """Holds the server step's norm at its smallest since `warmup_rounds`.

  Each round t the update g_t the optimizer receives has norm ||g_t||; from
  round `warmup_rounds` on the running minimum m_t = min ||g_s|| over rounds
  warmup_rounds <= s <= t is kept, and the learning rate is multiplied by
  min(1, m_t / ||g_t||): an update larger than the smallest one seen is
  scaled down to its norm, a smaller one passes unchanged (before
  `warmup_rounds`, and with no finite nonzero update yet, every update
  passes).

  Why, in DP training with an adaptive bound C: the noised mean update has
  norm about C sqrt(a^2 + r^2) (a the bounded mean's share of C, r = z
  sqrt(d) / n the noise's), so its norm follows C closely. Where the model
  converges, the clients' updates shrink, C with them, and the hold never
  acts. Where they grow instead (the noise a round adds to the weights
  raises the loss, whose larger gradients raise C, and with it the next
  round's noise), the hold stops the step from growing with them: the
  step's norm stays at most lr m_t, which keeps the noise entering the
  weights at its level after the warm-up, as a lower target quantile
  would have. The warm-up lets the adaptive norm leave its initial value
  (with norm learning rate 0.2 it can move by e^2 in 10 rounds).

  The update it reads is the aggregate a DP round releases, so the hold is
  post-processing: it costs no privacy budget. The state holds the inner
  optimizer's hyperparameters and state, the round count, the floor m_t
  (`update_norm_floor`, infinite until the warm-up ends) and the last
  multiplier (`hold_scale`).

  Args:
    inner_optimizer: a `tff.learning.optimizers.Optimizer` with a
      `learning_rate` hyperparameter (SGD(M), Adam, `oscillation_damped`,
      ...).
    warmup_rounds: a positive int, the first round whose update norm counts.

  Returns:
    A `tff.learning.optimizers.Optimizer`.

  Raises:
    TypeError: if `inner_optimizer` is not a TFF optimizer.
    ValueError: if `warmup_rounds` is not a positive integer.
  """
  _check_inner(inner_optimizer)
  checks.integer(warmup_rounds, 'warmup_rounds', minimum=1)
  return _GrowthHeld(inner_optimizer, warmup_rounds)


def step_scale(state) -> Optional[float]:
  """The product of the learning-rate multipliers in the state of a server
  optimizer built here (`learning_rate_scale`, `hold_scale`, through nested
  wrappers); None for the state of any other optimizer."""
  scale = None
  while isinstance(state, collections.abc.Mapping):
    for key in (_SCALE_KEY, _HOLD_KEY):
      if key in state:
        scale = (1.0 if scale is None else scale) * float(state[key])
    state = state.get(_INNER_KEY)
  return scale
