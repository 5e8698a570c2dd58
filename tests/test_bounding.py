"""Specification of the bounding core (`tff_clip.aggregation.bounding`)."""

import fractions
import math

from hypothesis import given, settings, strategies as st
import numpy as np
import pytest
import tensorflow as tf

from tff_clip.aggregation import bounding

DTYPES = [np.float16, tf.bfloat16.as_numpy_dtype, np.float32, np.float64]


def _exact_squared_norm(structure) -> fractions.Fraction:
  """The squared L2 norm of the stored values, in exact arithmetic.

  Every float16/bfloat16/float32/float64 value is a float64 and a Fraction
  exactly, and so are the squares and their sum: no rounding slack is
  needed to compare the norm with C, in any dtype.
  """
  return sum((fractions.Fraction(float(x))**2
              for leaf in tf.nest.flatten(structure)
              for x in np.ravel(np.asarray(leaf, np.float64))),
             fractions.Fraction(0))


# ----------------------------------------------------------------------------
# Random nested structures of any float dtype, with zeros, empties, scalars,
# huge and tiny magnitudes.


@st.composite
def leaf(draw):
  dtype = draw(st.sampled_from(DTYPES))
  shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=3))
  size = int(np.prod(shape)) if shape else 1
  kind = draw(st.sampled_from(['normal', 'zeros', 'huge', 'tiny']))
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  values = rng.standard_normal(size)
  if kind == 'zeros':
    values = np.zeros(size)
  elif kind == 'huge':
    limit = float(np.finfo(np.float16 if dtype == np.float16 else
                           np.float32).max)
    values = np.clip(values * (limit / 4), -limit, limit)  # Finite.
  elif kind == 'tiny':
    values = values * 1e-6 if dtype in (np.float16,) else values * 1e-30
  values = np.clip(values, -6e4, 6e4) if dtype == np.float16 else values
  return tf.constant(values.reshape(shape).astype(dtype))


structures = st.recursive(
    leaf(),
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3),
        st.dictionaries(st.sampled_from('abcd'), children, min_size=1,
                        max_size=3)),
    max_leaves=6)

norms = st.floats(min_value=1e-3, max_value=1e3)


def _assert_bounded(result, clip_norm):
  """Finite, and norm <= C exactly, as stored in the leaves' own dtypes
  (README: "the bounded update's norm is <= C in its own dtype")."""
  assert all(np.all(np.isfinite(np.asarray(x, np.float64)))
             for x in tf.nest.flatten(result))
  assert _exact_squared_norm(result) <= fractions.Fraction(clip_norm)**2


@settings(max_examples=60, deadline=None)
@given(structures, norms)
def test_clip_bounds_norm_for_any_finite_structure(structure, clip_norm):
  _assert_bounded(bounding.clip(structure, clip_norm), clip_norm)


@settings(max_examples=60, deadline=None)
@given(structures, norms)
def test_normalize_bounds_norm_for_any_finite_structure(structure, clip_norm):
  _assert_bounded(bounding.normalize(structure, clip_norm), clip_norm)


@settings(max_examples=40, deadline=None)
@given(structures, norms, st.sampled_from(['uniform', 'dim']))
def test_per_layer_boundings_bound_norm_for_any_split(structure, clip_norm,
                                                      split):
  budgets = bounding.layer_budgets(structure, clip_norm, split)
  for result in (bounding.clip_per_layer(structure, budgets),
                 bounding.normalize_per_layer(structure, budgets)):
    _assert_bounded(result, clip_norm)
    for leaf, budget in zip(tf.nest.flatten(result), np.asarray(budgets)):
      assert _exact_squared_norm(leaf) <= fractions.Fraction(float(budget))**2


@settings(max_examples=30, deadline=None)
@given(structures, st.sampled_from(bounding.BOUNDINGS),
       st.sampled_from([np.nan, np.inf, -np.inf]))
def test_nonfinite_update_becomes_zeros_and_is_counted(structure, method, bad):
  leaves = tf.nest.flatten(structure)
  poisoned = [x for x in leaves if x.shape.num_elements()]
  if not poisoned:
    return
  target = poisoned[0]
  flat = np.array(target.numpy(), dtype=np.float64).reshape(-1)
  flat[0] = bad
  new_leaf = tf.constant(flat.reshape(target.shape).astype(
      target.dtype.as_numpy_dtype))
  leaves = [new_leaf if x is target else x for x in leaves]
  structure = tf.nest.pack_sequence_as(structure, leaves)
  budgets = bounding.layer_budgets(structure, 1.0, 'dim')
  result = bounding.bound(structure, method, clip_norm=1.0, budgets=budgets)
  assert bool(result.nonfinite)
  for x in tf.nest.flatten(result.value):
    np.testing.assert_array_equal(np.asarray(x, np.float64), 0.0)


def test_clip_is_identity_below_the_norm():
  update = {'w': tf.constant([[0.3, -0.4]]), 'b': tf.constant([0.1])}
  result = bounding.clip(update, 1.0)
  tf.nest.map_structure(np.testing.assert_array_equal, result, update)


def test_clip_scales_to_the_norm_above_it():
  result = bounding.clip([tf.constant([3.0, 4.0])], 1.0)
  np.testing.assert_allclose(result[0], [0.6, 0.8], rtol=1e-6)


def test_clip_and_normalize_agree_when_every_norm_exceeds_clip_norm():
  # Das et al.: normalization equals clipping once all client
  # norms are >= C, so the aggregates agree too.
  rng = np.random.default_rng(0)
  updates = [[tf.constant(rng.normal(size=5) * 10, tf.float32),
              tf.constant(rng.normal(size=[2, 3]) * 10, tf.float32)]
             for _ in range(8)]
  clip_norm = 0.5
  assert all(float(bounding.global_l2_norm(u)) >= clip_norm for u in updates)
  clipped = [bounding.clip(u, clip_norm) for u in updates]
  normalized = [bounding.normalize(u, clip_norm) for u in updates]
  mean = lambda us: [np.mean([u[i] for u in us], axis=0) for i in range(2)]
  for a, b in zip(mean(clipped), mean(normalized)):
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_normalize_scales_small_updates_up_to_the_norm():
  result = bounding.normalize([tf.constant([0.03, 0.04])], 2.0)
  np.testing.assert_allclose(result[0], [1.2, 1.6], rtol=1e-6)


def test_normalize_keeps_zero_update_zero():
  result = bounding.normalize({'a': tf.zeros([3]), 'b': tf.zeros([])}, 1.0)
  for x in tf.nest.flatten(result):
    np.testing.assert_array_equal(x, 0.0)


def test_huge_finite_update_is_clipped_not_zeroed():
  result = bounding.clip([tf.constant([3e38, 3e38], tf.float32)], 1.0)
  np.testing.assert_allclose(result[0], [0.70710677] * 2, rtol=1e-6)


def test_tiny_update_is_normalized_not_divided_by_zero():
  # 1e-30 squared underflows float32 (TF also flushes subnormals to zero).
  result = bounding.normalize([tf.constant([1e-30, 0.0], tf.float32)], 1.0)
  np.testing.assert_allclose(result[0], [1.0, 0.0], rtol=1e-6)


def test_float16_update_normalized_without_overflow():
  result = bounding.normalize([tf.constant([1e-4, 0.0], tf.float16)], 100.0)
  assert result[0].dtype == tf.float16
  # Aimed 2 float16 roundoffs (2^-10) below C, never above it.
  np.testing.assert_allclose(np.asarray(result[0], np.float32), [100.0, 0.0],
                             rtol=2**-9)
  assert np.asarray(result[0], np.float32)[0] <= 100.0


def test_broken_in_graph_clip_norm_bounds_to_zero():
  update = [tf.constant([3.0, 4.0])]
  for bad in [np.nan, np.inf, -1.0]:
    result = bounding.clip(update, tf.constant(bad, tf.float32))
    np.testing.assert_array_equal(result[0], 0.0)


def test_bounding_works_inside_tf_function():
  fn = tf.function(lambda u, c: bounding.normalize(u, c))
  result = fn([tf.constant([3.0, 4.0])], tf.constant(1.0))
  np.testing.assert_allclose(result[0], [0.6, 0.8], rtol=1e-6)


def test_global_and_layer_norms():
  structure = {'a': tf.constant([3.0, 4.0]), 'b': tf.ones([2, 2], tf.float16)}
  np.testing.assert_allclose(bounding.global_l2_norm(structure),
                             math.sqrt(29.0), rtol=1e-6)
  np.testing.assert_allclose(bounding.layer_l2_norms(structure), [5.0, 2.0],
                             rtol=1e-6)


# ----------------------------------------------------------------------------
# Per-layer budgets.


STRUCTURE = {'kernel': tf.zeros([4, 5]), 'bias': tf.zeros([5]),
             'scale': tf.zeros([])}  # leaves, sorted keys: bias, kernel, scale


def test_dim_budgets_equal_closed_form():
  budgets = bounding.layer_budgets(STRUCTURE, 2.0, 'dim')
  sizes = np.array([5, 20, 1], np.float64)
  np.testing.assert_allclose(budgets, 2.0 * np.sqrt(sizes / sizes.sum()),
                             rtol=1e-6)


def test_uniform_budgets_are_c_over_sqrt_h():
  budgets = bounding.layer_budgets(STRUCTURE, 3.0, 'uniform')
  np.testing.assert_allclose(budgets, [3.0 / math.sqrt(3)] * 3, rtol=1e-6)


def test_weighted_budgets_follow_alpha_d():
  alpha = [2.0, 1.0, 4.0]
  budgets = bounding.layer_budgets(STRUCTURE, 1.0, alpha)
  mass = np.array(alpha) * np.array([5, 20, 1])
  np.testing.assert_allclose(budgets, np.sqrt(mass / mass.sum()), rtol=1e-6)


@pytest.mark.parametrize('split', ['uniform', 'dim', [1.0, 2.0, 3.0],
                                   bounding.ExplicitBudgets([0.6, 0.8, 0.0])])
def test_budgets_satisfy_sum_rule(split):
  budgets = bounding.layer_budgets(STRUCTURE, 1.0, split)
  np.testing.assert_allclose(np.sum(np.square(budgets)), 1.0, rtol=1e-6)


def test_budgets_accept_tensor_specs_and_tff_types():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  specs = tf.nest.map_structure(lambda x: tf.TensorSpec(x.shape, x.dtype),
                                STRUCTURE)
  expected = bounding.layer_budgets(STRUCTURE, 1.0, 'dim')
  np.testing.assert_allclose(bounding.layer_budgets(specs, 1.0, 'dim'),
                             expected)
  tff_type = tff.types.tensorflow_to_type(specs)
  np.testing.assert_allclose(bounding.layer_budgets(tff_type, 1.0, 'dim'),
                             expected)


def test_per_layer_with_one_leaf_equals_global():
  update = [tf.constant([[3.0, 4.0], [1.0, 2.0]])]
  budgets = bounding.layer_budgets(update, 1.5, 'dim')
  np.testing.assert_allclose(budgets, [1.5], rtol=1e-6)
  np.testing.assert_allclose(bounding.clip_per_layer(update, budgets)[0],
                             bounding.clip(update, 1.5)[0], rtol=1e-6)
  np.testing.assert_allclose(bounding.normalize_per_layer(update, budgets)[0],
                             bounding.normalize(update, 1.5)[0], rtol=1e-6)


def test_per_layer_clip_bounds_each_layer_by_its_budget():
  update = {'a': tf.constant([30.0, 40.0]), 'b': tf.constant([0.01])}
  budgets = bounding.layer_budgets(update, 1.0, 'uniform')
  result = bounding.clip_per_layer(update, budgets)
  np.testing.assert_allclose(np.linalg.norm(result['a']), 1 / math.sqrt(2),
                             rtol=1e-6)
  np.testing.assert_allclose(result['b'], [0.01])


# ----------------------------------------------------------------------------
# Bad input.


@pytest.mark.parametrize('bad', [0.0, -1.0, float('nan'), float('inf')])
def test_bad_clip_norm_is_rejected_naming_it(bad):
  with pytest.raises(ValueError, match='clip_norm'):
    bounding.clip([tf.constant([1.0])], bad)
  with pytest.raises(ValueError, match='clip_norm'):
    bounding.layer_budgets(STRUCTURE, bad, 'dim')


def test_unknown_split_is_rejected_naming_it():
  with pytest.raises(ValueError, match='split'):
    bounding.layer_budgets(STRUCTURE, 1.0, 'by_magic')


def test_weights_must_cover_every_layer():
  with pytest.raises(ValueError, match='split'):
    bounding.layer_budgets(STRUCTURE, 1.0, [1.0, 2.0])


@pytest.mark.parametrize('weights', [[1.0, 0.0, 1.0], [1.0, -2.0, 1.0]])
def test_nonpositive_weights_are_rejected(weights):
  with pytest.raises(ValueError, match='split'):
    bounding.layer_budgets(STRUCTURE, 1.0, weights)


def test_explicit_budgets_must_satisfy_sum_rule():
  with pytest.raises(ValueError, match='sum rule'):
    bounding.layer_budgets(STRUCTURE, 1.0,
                           bounding.ExplicitBudgets([0.5, 0.5, 0.5]))


def test_integer_leaves_are_rejected():
  with pytest.raises(TypeError, match='float'):
    bounding.clip([tf.constant([1, 2])], 1.0)


@pytest.mark.parametrize('budgets', [[-0.0, 1.0], [float('nan'), 1.0],
                                     [-0.5, 1.0], []])
def test_explicit_budgets_refuse_signed_zero_negative_and_nonfinite(budgets):
  with pytest.raises(ValueError, match='split'):
    bounding.ExplicitBudgets(budgets)


# ----------------------------------------------------------------------------
# Many clients at once (`bound_batch`): each client's update bounded as
# `bound` bounds it alone, with the same exact guarantee.


@st.composite
def cohorts(draw):
  """(K clients' updates stacked on a leading axis, one update per client):
  leaves of any float dtype and shape, each client of its own kind (normal,
  zeros, huge, tiny, or poisoned with a NaN or an Inf)."""
  shapes = draw(st.lists(st.lists(st.integers(0, 3), max_size=2),
                         min_size=1, max_size=3))
  dtypes = draw(st.lists(st.sampled_from(DTYPES), min_size=len(shapes),
                         max_size=len(shapes)))
  clients = []
  for _ in range(draw(st.integers(1, 4))):
    kind = draw(st.sampled_from(['normal', 'zeros', 'huge', 'tiny', 'nan',
                                 'inf']))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    update = []
    for shape, dtype in zip(shapes, dtypes):
      values = rng.standard_normal(shape)
      limit = float(np.finfo(np.float16 if dtype == np.float16
                             else np.float32).max)
      if kind == 'zeros':
        values = np.zeros(shape)
      elif kind == 'huge':
        values = np.clip(values * (limit / 4), -limit, limit)
      elif kind == 'tiny':
        values = values * (1e-6 if dtype == np.float16 else 1e-30)
      elif kind in ('nan', 'inf') and values.size:
        values.flat[0] = np.nan if kind == 'nan' else np.inf
      if dtype == np.float16:
        values = np.clip(values, -6e4, 6e4)
      update.append(values.astype(dtype))
    clients.append(update)
  stacked = [tf.constant(np.stack([c[i] for c in clients]))
             for i in range(len(shapes))]
  return stacked, [[tf.constant(x) for x in c] for c in clients]


def _tolerance(dtype):
  """Four ulps of the stored dtype (float32's for float64: the factors are
  rounded to float32 on the fast path)."""
  eps = {np.float16: 2.0**-10, np.float32: 2.0**-23, np.float64: 2.0**-23}
  return 4 * eps.get(dtype, 2.0**-7)  # bfloat16's otherwise.


@settings(max_examples=60, deadline=None)
@given(cohorts(), norms, st.sampled_from(bounding.BOUNDINGS))
def test_a_batch_of_clients_is_bounded_as_each_client_alone(cohort, clip_norm,
                                                             method):
  stacked, clients = cohort
  budgets = bounding.layer_budgets(clients[0], clip_norm, 'dim')
  batch = bounding.bound_batch(stacked, method, clip_norm=clip_norm,
                               budgets=budgets)
  for k, update in enumerate(clients):
    alone = bounding.bound(update, method, clip_norm=clip_norm,
                           budgets=budgets)
    value = [x[k] for x in batch.value]
    # The guarantee, exactly: the stored slice's norm <= C (per layer: its
    # budget), zeros for a non-finite update.
    if bool(alone.nonfinite):
      for x in value:
        np.testing.assert_array_equal(np.asarray(x, np.float64), 0.0)
    else:
      _assert_bounded(value, clip_norm)
      if method.startswith('per_layer'):
        for x, budget in zip(value, np.asarray(budgets)):
          assert _exact_squared_norm(x) <= fractions.Fraction(
              float(budget))**2
    # And what `bound` gives the client alone, to its dtype's rounding.
    for x, y in zip(value, alone.value):
      np.testing.assert_allclose(np.asarray(x, np.float64),
                                 np.asarray(y, np.float64),
                                 rtol=_tolerance(y.dtype.as_numpy_dtype),
                                 atol=0)
    np.testing.assert_array_equal(batch.nonfinite[k], alone.nonfinite)
    np.testing.assert_array_equal(batch.was_bounded[k], alone.was_bounded)
    np.testing.assert_allclose(batch.global_norm[k], alone.global_norm,
                               rtol=1e-6)
    np.testing.assert_allclose(batch.layer_norms[k], alone.layer_norms,
                               rtol=1e-6)


def test_a_batch_needs_a_client_axis():
  with pytest.raises(ValueError, match='leading client axis'):
    bounding.bound_batch([tf.constant(1.0)], 'clip', clip_norm=1.0)


# ----------------------------------------------------------------------------
# Rounding among the subnormals: float16 stores entries below 2^-14 as
# multiples of 2^-24, so an entry scaled to 0.51 2^-24 is stored as 2^-24,
# twice its value; a relative margin alone cannot absorb that.


def _exact_squared_norm_of_many(leaves) -> fractions.Fraction:
  """`_exact_squared_norm` of large leaves: each distinct value once."""
  total = fractions.Fraction(0)
  for x in leaves:
    values, counts = np.unique(np.asarray(x, np.float64), return_counts=True)
    total += sum((fractions.Fraction(float(v))**2 * int(c)
                  for v, c in zip(values, counts)), fractions.Fraction(0))
  return total


# 2^20 float16 ones bounded to a norm C whose every entry, C / 2^10 less the
# margin, is 0.51 2^-24: stored as 2^-24, the norm 1.96 C without the slack.
_ONES = 2**20
_SUBNORMAL_C = float(np.float32(
    0.51 * 2.0**-24 * 2**10 / (1 - 8 * 2.0**-24 - 2 * 2.0**-11)))


@pytest.mark.parametrize('method', ['clip', 'normalize', 'per_layer_clip',
                                    'per_layer_normalize'])
def test_float16_entries_rounded_among_the_subnormals_stay_within_c(method):
  structure = [tf.ones([_ONES], tf.float16)]
  budgets = bounding.layer_budgets(structure, _SUBNORMAL_C, 'dim')
  bound = fractions.Fraction(_SUBNORMAL_C)**2
  alone = bounding.bound(structure, method, clip_norm=_SUBNORMAL_C,
                         budgets=budgets)
  assert _exact_squared_norm_of_many(alone.value) <= bound
  batch = bounding.bound_batch([tf.ones([2, _ONES], tf.float16)], method,
                               clip_norm=_SUBNORMAL_C, budgets=budgets)
  for k in range(2):
    assert _exact_squared_norm_of_many([batch.value[0][k]]) <= bound


def test_a_crafted_float16_tail_cannot_push_a_usable_norm_over_c():
  # C = 1e-3: one entry carries the norm; a million entries land just above
  # 2^-25 once scaled and would each be stored as 2^-24 (1.00027 C).
  clip_norm = 1e-3
  update = np.full(10**6 + 1, 0.52 * 2.0**-24 / clip_norm, np.float16)
  update[0] = 1.0
  for method in ('clip', 'normalize'):
    value = bounding.bound([tf.constant(update)], method,
                           clip_norm=clip_norm).value
    assert _exact_squared_norm_of_many(value) <= fractions.Fraction(
        clip_norm)**2
  # Far from the subnormals the slack changes nothing a float32 bound stores.
  wide = tf.constant(update.astype(np.float32))
  np.testing.assert_array_equal(
      bounding.clip([wide], 0.5)[0],
      wide * tf.cast(0.5 * bounding.rounding_margins([wide], tf.float32)[0]
                     / np.linalg.norm(update.astype(np.float64)), tf.float32))
