"""A server step that shortens itself when consecutive updates point apart.

`oscillation_damped(inner_optimizer)` wraps any TFF optimizer with a
learning rate: it halves that learning rate when the cosine between
consecutive updates, averaged over rounds, falls further below zero than
noise would take it. It is tff_clip's default server step in DP runs
(`--server_step`, docs/frontier.md "A server step that follows the
updates"): it reads only the aggregate a round releases, so it costs no
privacy budget.

Reference: Chee, Toulis, "Convergence diagnostics for stochastic gradient
descent with constant learning rate", AISTATS 2018 (after Pflug 1983, "On
the determination of the step size in stochastic quasigradient methods").
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip import checks

__all__ = ['oscillation_damped']

_Optimizer = tff.learning.optimizers.Optimizer
_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY

_SCALE_KEY = 'learning_rate_scale'
_COSINE_AVERAGE_KEY = 'cosine_average'
_PREVIOUS_KEY = 'previous_gradient'
_INNER_KEY = 'inner'


def _global_dot(a, b):
  return tf.add_n([tf.reduce_sum(x * y) for x, y in zip(a, b)] or
                  [tf.constant(0.0)])


class _OscillationDamped(_Optimizer):
  """See `oscillation_damped`."""

  def __init__(self, inner_optimizer, threshold, decay, factor):
    self._inner = inner_optimizer
    self._threshold = float(threshold)
    self._decay = float(decay)
    self._factor = float(factor)

  @property
  def inner_optimizer(self) -> _Optimizer:
    return self._inner

  def initialize(self, specs):
    inner = self._inner.initialize(specs)
    state = collections.OrderedDict(self._inner.get_hparams(inner))
    state[_INNER_KEY] = inner
    state[_SCALE_KEY] = tf.constant(1.0)
    state[_COSINE_AVERAGE_KEY] = tf.constant(0.0)
    state[_PREVIOUS_KEY] = tf.nest.map_structure(
        lambda s: tf.zeros(s.shape, tf.float32), specs)
    return state

  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
        gradients)
    flat_g = tf.nest.flatten(gradients)
    flat_p = tf.nest.flatten(state[_PREVIOUS_KEY])
    present = [i for i, leaf in enumerate(flat_g) if leaf is not None]
    g = [tf.cast(flat_g[i], tf.float32) for i in present]
    p = [flat_p[i] for i in present]
    dimension = float(sum(int(np.prod(x.shape)) for x in g))
    cosine = tf.math.divide_no_nan(
        _global_dot(g, p), tf.sqrt(_global_dot(g, g) * _global_dot(p, p)))
    # A non-finite update (which the aggregators zero) is no evidence.
    cosine = tf.where(tf.math.is_finite(cosine), cosine, 0.0)
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
    average = tf.where(oscillating, 0.0, average)
    hparams = collections.OrderedDict(
        (key, state[key]) for key in self._inner.get_hparams(state[_INNER_KEY]))
    learning_rate = hparams[_LEARNING_RATE_KEY]
    hparams[_LEARNING_RATE_KEY] = learning_rate * tf.cast(
        scale, tf.convert_to_tensor(learning_rate).dtype)
    inner, weights = self._inner.next(
        self._inner.set_hparams(state[_INNER_KEY], hparams), weights,
        gradients)
    new_state = collections.OrderedDict(state)
    new_state[_INNER_KEY] = inner
    new_state[_SCALE_KEY] = scale
    new_state[_COSINE_AVERAGE_KEY] = average
    for k, i in enumerate(present):
      flat_p[i] = g[k]
    new_state[_PREVIOUS_KEY] = tf.nest.pack_sequence_as(
        state[_PREVIOUS_KEY], flat_p)
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
  updates are noise keeps its learning rate.

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
  if not isinstance(inner_optimizer, _Optimizer):
    raise TypeError('`inner_optimizer` must be a '
                    '`tff.learning.optimizers.Optimizer`; got '
                    f'{type(inner_optimizer).__name__}.')
  checks.positive_float(threshold, 'threshold')
  checks.probability(decay, 'decay', low_open=False)
  checks.probability(factor, 'factor')
  return _OscillationDamped(inner_optimizer, threshold, decay, factor)
