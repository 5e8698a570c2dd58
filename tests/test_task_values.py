"""Specification of what a session computes from its task alone, once.

`task_values.initial_model_weights(task, seed)` is the model built eagerly
under `tf.keras.utils.set_random_seed(seed)` (the oracle below builds it so
itself), whatever ran in the process before; TensorFlow's global seed
(whose setting clears its kernel caches, so that every traced function is
instantiated again) is set only for a model whose construction reads it; a
later session of the same task and seed takes the same weights, drawn once,
read-only, since every such session shares them.
`model_size` is the model's trainable count and tensors, read from the
drawn weights (the same at every seed).
"""

import random

import numpy as np
import pytest

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from tff_clip.program import task_values


class _Task:
  """A task as a session sees it: `model_fn` makes a fresh model."""

  def __init__(self, units=3):
    spec = (tf.TensorSpec([None, 4], tf.float32),
            tf.TensorSpec([None, 1], tf.int32))
    self.model_fn = lambda: tff.learning.models.from_keras_model(
        tf.keras.Sequential([tf.keras.layers.Dense(units, input_shape=(4,)),
                             tf.keras.layers.Dense(2)]),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        input_spec=spec)


def _drawn_fresh(task, seed):
  """The oracle: the model's weights as built right after seeding."""
  tf.keras.utils.set_random_seed(seed)
  weights = tff.learning.models.ModelWeights.from_model(task.model_fn())
  return [v.numpy() for v in weights.trainable]


def test_initial_weights_are_the_model_built_under_the_seed_whatever_ran_before():
  task = _Task()
  first = task_values.initial_model_weights(task, 5).trainable
  expected = _drawn_fresh(task, 5)
  tf.random.uniform([3])  # Random draws in between.
  other = task_values.initial_model_weights(task, 6).trainable
  again = task_values.initial_model_weights(task, 5).trainable
  for a, b, c in zip(first, expected, again):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(c, b)
  assert any(not np.array_equal(a, b) for a, b in zip(other, expected))


def test_keras_initializers_are_drawn_without_clearing_the_caches(
    monkeypatch):
  # Keras's initializers seed stateless ops from Keras's own generator: the
  # draw needs no global seed, so none is set (setting it clears every
  # traced function's kernels), for a new seed or a new task alike.
  def clears_caches(seed):
    raise AssertionError(f'set_seed({seed}) cleared the caches')

  task = _Task()
  expected = {seed: _drawn_fresh(task, seed) for seed in (8, 9)}
  monkeypatch.setattr(tf.keras.utils, 'set_random_seed', clears_caches)
  monkeypatch.setattr(tf.random, 'set_seed', clears_caches)
  for seed in (8, 9):
    for a, b in zip(task_values.initial_model_weights(task, seed).trainable,
                    expected[seed]):
      np.testing.assert_array_equal(a, b)
  task_values.initial_model_weights(_Task(), 8)


def _stateful_model_fn():
  """A model whose initializer is a stateful random op (reads the global
  seed)."""

  def stateful_init(shape, dtype=None):
    return tf.random.uniform(shape, dtype=dtype)

  spec = (tf.TensorSpec([None, 4], tf.float32),
          tf.TensorSpec([None, 1], tf.int32))
  return tff.learning.models.from_keras_model(
      tf.keras.Sequential([tf.keras.layers.Dense(
          3, input_shape=(4,), kernel_initializer=stateful_init)]),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(), input_spec=spec)


def test_a_model_that_reads_the_global_seed_is_drawn_under_it():
  # A stateful random op in the model's construction reads TensorFlow's
  # global seed: the draw is then made under it, as the oracle's.
  task = _Task()
  task.model_fn = _stateful_model_fn
  expected = _drawn_fresh(task, 4)
  tf.random.set_seed(77)  # Another global seed, left by something else.
  drawn = task_values.initial_model_weights(task, 4).trainable
  for a, b in zip(drawn, expected):
    np.testing.assert_array_equal(a, b)
  tf.random.set_seed(None)


def _unseeded_model_weights(task):
  """What TFF's tracing draws: a model built from whatever state is left."""
  return [v.numpy() for v in tff.learning.models.ModelWeights.from_model(
      task.model_fn()).trainable]


@pytest.mark.parametrize('stateful', [False, True])
def test_a_draw_leaves_what_follows_as_it_would_have_been(stateful):
  # TFF traces a process after the session drew its initial weights, and
  # the trace's models draw from Python's, NumPy's and Keras's generators
  # (and TensorFlow's global seed): a draw at seed 1 or 2 must leave them as
  # it found them, so that the traced graphs do not depend on the seed.
  task = _Task()
  if stateful:
    task.model_fn = _stateful_model_fn
  after = {}
  for seed in (1, 2):
    tf.keras.utils.set_random_seed(0)
    tf.random.set_seed(None)
    task_values.initial_model_weights(_Task() if not stateful else task, seed)
    after[seed] = (random.random(), np.random.random(),
                   _unseeded_model_weights(_Task()),
                   context.global_seed())
  tf.keras.utils.set_random_seed(0)
  tf.random.set_seed(None)
  oracle = (random.random(), np.random.random(),
            _unseeded_model_weights(_Task()), context.global_seed())
  for seed in (1, 2):
    assert after[seed][:2] == oracle[:2], seed
    for a, b in zip(after[seed][2], oracle[2]):
      np.testing.assert_array_equal(a, b)
    assert after[seed][3] is None, seed


def test_a_later_session_of_the_task_and_seed_draws_nothing(monkeypatch):
  task = _Task()
  drawn = task_values.initial_model_weights(task, 8)
  monkeypatch.setattr(task, 'model_fn', lambda: pytest.fail('drawn again'))
  assert task_values.initial_model_weights(task, 8) is drawn


def test_shared_weights_cannot_be_changed_in_place():
  weights = task_values.initial_model_weights(_Task(), 1)
  with pytest.raises(ValueError, match='read-only'):
    weights.trainable[0][0, 0] = 1.0


def test_model_size_counts_the_trainable_values_and_tensors():
  # Dense 4 -> 7 -> 2: (4 * 7 + 7) + (7 * 2 + 2) values in 4 tensors.
  assert task_values.model_size(_Task(units=7), 0) == (35 + 16, 4)


def test_model_size_is_read_from_the_drawn_weights_at_any_seed():
  task, built = _Task(units=7), []
  model_fn = task.model_fn
  task.model_fn = lambda: built.append(1) or model_fn()
  task_values.initial_model_weights(task, 3)
  assert task_values.model_size(task, 3) == (35 + 16, 4)
  assert len(built) == 1  # The draw's model only: none built for the size.
  assert task_values.model_size(task, 4) == (35 + 16, 4)  # Same at any seed.
