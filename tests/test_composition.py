"""How the DP factory composes with TFF's own (docs/composition.md).

`dp_factory` is both an unweighted and a weighted `tff.aggregators` factory
by default; TFF's wrappers (`zeroing_factory`, `clipping_factory`) make such
a factory weighted, so `dp_factory(..., weighted=False)` gives the
unweighted-only factory (TFF's `DifferentiallyPrivateFactory`'s kind) that
stays unweighted inside them. TFF's argument names for the same quantities
are refused with the name to use. The oracle for "composes" is TFF itself:
its builders' type checks and TFF's default execution context.
"""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import as_a_user  # pylint: disable=g-bad-import-order
from tff_clip.aggregation import aggregators
from tff_clip.aggregation import dp

DP = dict(noise_multiplier=0.5, clients_per_round=3.0, clip_norm=1.0)


def _model_fn():
  keras_model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
  return tff.learning.models.from_keras_model(
      keras_model, input_spec=(tf.TensorSpec([None, 3]),
                               tf.TensorSpec([None], tf.int32)),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


@pytest.mark.parametrize('weighted, unweighted_kind, weighted_kind', [
    (None, True, True), (False, True, False), (True, False, True)])
def test_weighted_chooses_the_kind_of_factory(weighted, unweighted_kind,
                                              weighted_kind):
  factory = dp.dp_factory('clip', weighted=weighted, **DP)
  assert isinstance(factory, tff.aggregators.UnweightedAggregationFactory
                    ) == unweighted_kind
  assert isinstance(factory, tff.aggregators.WeightedAggregationFactory
                    ) == weighted_kind
  assert isinstance(factory, dp.BaseDPBoundingFactory)


def test_zeroing_keeps_the_unweighted_factory_unweighted():
  zeroed = tff.aggregators.zeroing_factory(
      10.0, dp.dp_factory('clip', weighted=False, **DP))
  assert isinstance(zeroed, tff.aggregators.UnweightedAggregationFactory)
  assert not isinstance(zeroed, tff.aggregators.WeightedAggregationFactory)
  # And the default factory, being both kinds, comes out weighted (TFF's
  # rule): the composition table's refused row.
  assert isinstance(tff.aggregators.zeroing_factory(
      10.0, dp.dp_factory('clip', **DP)),
                    tff.aggregators.WeightedAggregationFactory)


def test_unweighted_and_default_factories_build_the_same_process():
  value_type = tff.types.TensorType(np.float32, [4])
  default = dp.dp_factory('clip', noise_seed=1, **DP).create(value_type)
  unweighted = dp.dp_factory('clip', noise_seed=1, weighted=False,
                             **DP).create(value_type)
  assert (str(default.next.type_signature) ==
          str(unweighted.next.type_signature))
  with pytest.raises(TypeError):  # Unweighted only: no weight argument.
    dp.dp_factory('clip', weighted=False, **DP).create(
        value_type, tff.types.TensorType(np.float32))


@pytest.mark.parametrize('weighted', [0, 1, 'no'])
def test_weighted_other_than_none_true_false_is_refused(weighted):
  with pytest.raises(TypeError, match=r'^`weighted` must be None'):
    dp.dp_factory('clip', weighted=weighted, **DP)


@pytest.mark.parametrize('tff_name, ours, value', [
    ('target_unclipped_quantile', 'target_quantile', 0.5),
    ('initial_l2_norm_clip', 'initial_clip_norm', 0.1),
    ('learning_rate', 'clip_learning_rate', 0.2),
    ('clip', 'clip_norm', 1.0),
    ('l2_norm_clip', 'clip_norm', 1.0),
    ('expected_clients_per_round', 'clients_per_round', 3.0)])
def test_tffs_names_are_refused_naming_ours(tff_name, ours, value):
  with pytest.raises(TypeError) as raised:
    dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=3.0,
                  **{tff_name: value})
  message = str(raised.value)
  assert '\n' not in message
  assert message == (f"`{tff_name}` is TFF's name; tff_clip calls it "
                     f'`{ours}`: dp_factory(..., {ours}=...).')
  dp.dp_factory('clip', **{'noise_multiplier': 1.0, 'clients_per_round': 3.0,
                           ours: value})  # The named one is accepted.


def test_tffs_adaptive_names_all_have_a_tff_clip_name():
  """Every argument of TFF's `gaussian_adaptive`/`gaussian_fixed` is one of
  dp_factory's, or mapped to one (read from TFF's signatures, the oracle)."""
  import inspect  # pylint: disable=g-import-not-at-top
  private = tff.aggregators.DifferentiallyPrivateFactory
  names = set(dp.dp_factory.__signature__.parameters)
  for builder in (private.gaussian_adaptive, private.gaussian_fixed):
    for name in inspect.signature(builder).parameters:
      assert name in names or dp.TFF_NAMES.get(name) in names, name


def test_a_mean_as_the_record_sum_is_refused():
  with pytest.raises(TypeError, match='must sum the bounded records'):
    dp.dp_factory('clip', record_aggregation_factory=(
        tff.aggregators.UnweightedMeanFactory()), **DP)


def test_tffs_secure_aggregator_as_the_record_sum_is_refused():
  # TFF's test context runs it as given: [0.1, 0.1] for the mean [0.2, 0.2]
  # of two clients (a mean, divided by the cohort again), with the zeroing
  # and clipping counts and the clipping norm released without noise.
  with pytest.raises(TypeError, match=(
      r"got TFF's zeroing or clipping, UnweightedRobustFactory, .* without "
      'noise')):
    dp.dp_factory('clip', record_aggregation_factory=(
        tff.learning.secure_aggregator(weighted=False)), **DP)


@pytest.mark.parametrize('record, refused', [
    (lambda: tff.aggregators.HadamardTransformFactory(
        tff.aggregators.UnweightedMeanFactory()),
     'a mean, UnweightedMeanFactory (inside HadamardTransformFactory)'),
    (lambda: tff.learning.secure_aggregator(
        zeroing=False, clipping=False, weighted=False),
     'a mean, UnweightedMeanFactory.'),
    (lambda: tff.aggregators.zeroing_factory(
        10.0, tff.aggregators.SumFactory()),
     "TFF's zeroing or clipping, UnweightedRobustFactory,"),
    (lambda: tff.aggregators.clipping_factory(
        10.0, tff.aggregators.SecureSumFactory(100.0)),
     "TFF's zeroing or clipping, UnweightedRobustFactory,"),
], ids=['mean-in-rotation', 'bare-mean', 'zeroing', 'clipping'])
def test_a_record_sum_wrapping_a_mean_or_tffs_robust_wrappers_is_refused(
    record, refused):
  with pytest.raises(TypeError) as raised:
    dp.dp_factory('clip', record_aggregation_factory=record(), **DP)
  assert refused in str(raised.value)


def test_a_secure_sum_inside_a_rotation_is_checked_as_one_given_alone():
  # The rotation keeps the norm: each rotated coordinate still reaches C.
  with pytest.raises(ValueError, match=r'inside the bounded values\' reach'):
    dp.dp_factory('clip', record_aggregation_factory=(
        tff.aggregators.HadamardTransformFactory(
            tff.aggregators.SecureSumFactory(0.5))), **DP)
  dp.dp_factory('clip', record_aggregation_factory=(
      tff.aggregators.HadamardTransformFactory(
          tff.aggregators.SecureSumFactory(1.0))), **DP)


def test_an_int_is_taken_as_its_float_as_on_the_command_line():
  # `--clip_norm=1` parses to 1.0; so do the library's int arguments.
  spec = dp.dp_factory('clip', noise_multiplier=1, clients_per_round=3,
                       clip_norm=1).spec
  assert (spec.noise_multiplier, spec.clients_per_round, spec.clip_norm) == (
      1.0, 3.0, 1.0)
  assert all(type(v) is float for v in (  # pylint: disable=unidiomatic-typecheck
      spec.noise_multiplier, spec.clients_per_round, spec.clip_norm))
  factory = aggregators.clip_factory(1)
  assert type(factory._clip_norm) is float  # pylint: disable=protected-access,unidiomatic-typecheck
  value_type = tff.types.TensorType(np.float32, [3])
  assert str(factory.create(value_type).next.type_signature) == str(
      aggregators.clip_factory(1.0).create(value_type).next.type_signature)
  with pytest.raises(TypeError, match='`clip_norm` must be a float'):
    aggregators.clip_factory(True)  # A bool is not a number here.


def test_zeroed_unweighted_dp_builds_into_unweighted_fed_avg():
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      _model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      model_aggregator=tff.aggregators.zeroing_factory(
          10.0, dp.dp_factory('clip', weighted=False, **DP)))
  assert process.next.type_signature is not None


OUTSIDE = textwrap.dedent('''\
    import numpy as np
    import tensorflow as tf
    import tensorflow_federated as tff
    from tff_clip.aggregation import dp

    def model_fn():
      keras_model = tf.keras.Sequential(
          [tf.keras.layers.Dense(2, input_shape=(3,))])
      return tff.learning.models.from_keras_model(
          keras_model, input_spec=(tf.TensorSpec([None, 3]),
                                   tf.TensorSpec([None], tf.int32)),
          loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    rng = np.random.default_rng(0)
    data = []
    for _ in range(3):
      x = rng.normal(size=(8, 3)).astype(np.float32)
      data.append(tf.data.Dataset.from_tensor_slices(
          (x, (x[:, 0] > 0).astype(np.int32))).batch(4))

    def private(**kwargs):
      return dp.dp_factory('clip', noise_multiplier=0.5, clients_per_round=3.0,
                           clip_norm=1.0, **kwargs)

    sgd = tff.learning.optimizers.build_sgdm(0.1)
    for name, build, aggregator in [
        ('unweighted', tff.learning.algorithms.build_unweighted_fed_avg,
         tff.aggregators.zeroing_factory(10.0, private(weighted=False))),
        ('weighted', tff.learning.algorithms.build_weighted_fed_avg,
         tff.aggregators.zeroing_factory(10.0, private())),
    ]:
      process = build(model_fn, client_optimizer_fn=sgd,
                      model_aggregator=aggregator)
      state = process.initialize()
      for _ in range(3):
        output = process.next(state, data)
        state = output.state
      event = dp.extract_dp_event(state.aggregator['inner_agg'])
      print(name, 'rounds', 3, 'zeroed',
            int(output.metrics['aggregator']['zeroed_count']),
            'noise', event.noise_multiplier)
    ''')


@pytest.mark.slow  # Two fed_avg processes, three rounds each (about 60 s).
def test_a_script_outside_the_checkout_runs_zeroed_dp_in_both_fed_avgs(
    tmp_path):
  (tmp_path / 'composed.py').write_text(OUTSIDE)
  result = subprocess.run(
      [sys.executable, 'composed.py'], cwd=tmp_path, capture_output=True, text=True,
      timeout=900, check=False,
      env=as_a_user.env(PYTHONPATH=str(as_a_user.REPO)))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split('\n')[:2] == [
      'unweighted rounds 3 zeroed 0 noise 0.5',
      'weighted rounds 3 zeroed 0 noise 0.5'], result.stdout


def _docs_line(start):
  """The refusal line docs/composition.md quotes in the row `start`s."""
  page = (as_a_user.REPO / 'docs' / 'composition.md').read_text()
  row = next(line for line in page.splitlines() if line.startswith(start))
  return row.rstrip(' |').rsplit(' | ', 1)[1].strip('`')


def test_zeroed_default_factory_in_unweighted_fed_avg_is_tffs_one_line():
  with pytest.raises(TypeError) as raised:
    tff.learning.algorithms.build_unweighted_fed_avg(
        _model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
        model_aggregator=tff.aggregators.zeroing_factory(
            10.0, dp.dp_factory('clip', **DP)))
  assert f'TypeError: {raised.value}' == _docs_line(
      '| `build_unweighted_fed_avg(model_aggregator=zeroing_factory(10.0, '
      'dp_factory(...)))`')


def test_the_documented_construction_refusals_are_what_is_raised():
  for start, record in [
      ('| `record_aggregation_factory=tff.aggregators.UnweightedMeanFactory()',
       tff.aggregators.UnweightedMeanFactory()),
      ('| `record_aggregation_factory=tff.learning.secure_aggregator('
       'weighted=False)`', tff.learning.secure_aggregator(weighted=False))]:
    with pytest.raises(TypeError) as raised:
      dp.dp_factory('clip', record_aggregation_factory=record, **DP)
    assert f'TypeError: {raised.value}' == _docs_line(start)
  with pytest.raises(TypeError) as raised:
    dp.dp_factory('clip', target_unclipped_quantile=0.5, **DP)
  assert f'TypeError: {raised.value}' == _docs_line(
      '| `dp_factory(..., target_unclipped_quantile=0.5)`')


@pytest.mark.slow  # One fed_avg process run in three ways (about 90 s).
def test_a_secure_record_sum_runs_in_process_and_in_tffs_test_context():
  from tff_clip.runtime import simulation  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  data = []
  for _ in range(3):
    x = rng.normal(size=(8, 3)).astype(np.float32)
    data.append(tf.data.Dataset.from_tensor_slices(
        (x, (x[:, 0] > 0).astype(np.int32))).batch(4))
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      _model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      model_aggregator=dp.dp_factory(
          'clip', record_aggregation_factory=tff.aggregators.SecureSumFactory(
              1.0), **DP))
  runner = simulation.InProcessRunner(process)
  output = runner.next(runner.initialize(), data)
  assert np.isfinite(output.metrics['client_work']['train']['loss'])
  tff.backends.test.set_sync_test_cpp_execution_context()
  try:
    output = process.next(process.initialize(), data)
    assert np.isfinite(output.metrics['client_work']['train']['loss'])
  finally:
    tff.backends.native.set_sync_local_cpp_execution_context()


# A secure sum clamps every summand to its thresholds, the query's own counts
# included: 1 per client for denominator='actual' (and the noise-free
# adaptive norm's weight), +-1/2 per client for an adaptive norm's clipped
# count. SecureSumFactory(0.5) under 'actual' returned twice the mean (0.4
# for clients [0.3, 0.1] and [0.1, 0.3]).
@pytest.mark.parametrize('secure_sum, arguments', [
    (tff.aggregators.SecureSumFactory(0.5), dict(denominator='actual')),
    (tff.aggregators.SecureSumFactory(0.25), dict(clip_norm='adaptive')),
    (tff.aggregators.SecureSumFactory(1.0, 0.0), dict(clip_norm='adaptive')),
    (tff.aggregators.SecureSumFactory(0.75),
     dict(clip_norm='adaptive', noise_multiplier=0.0)),
    (tff.aggregators.SecureSumFactory(aggregators.constant_norm_process(1.0)),
     dict(denominator='actual')),
], ids=['actual-count', 'clipped-count', 'clipped-count-lower',
        'noise-free-weight', 'estimated-threshold'])
def test_a_secure_sum_that_could_clamp_the_querys_counts_is_refused(
    secure_sum, arguments):
  with pytest.raises(ValueError, match=r'^`record_aggregation_factory`'):
    dp.dp_factory('clip', record_aggregation_factory=secure_sum,
                  **{**DP, **arguments})


@pytest.mark.parametrize('secure_sum', [
    tff.aggregators.SecureSumFactory(0.5),
    tff.aggregators.SecureSumFactory(1.0, -0.5)], ids=['upper', 'lower'])
def test_a_secure_sum_inside_the_bounded_values_reach_is_refused(secure_sum):
  """TFF's secure sum reports how many clients it clamped, without noise,
  in the measurements (under `dp`, beside the query's own). Thresholds of
  at least the values' reach C clamp no bounded value (the counts stay 0);
  inside it they would tell how many updates reached past them, and bias
  the mean."""
  process = dp.dp_factory(
      'clip', record_aggregation_factory=tff.aggregators.SecureSumFactory(
          1.0), weighted=False, **DP).create(
              tff.types.TensorType(np.float32, [2]))
  released = str(process.next.type_signature.result.measurements.member.dp)
  assert 'secure_upper_clipped_count=int32' in released
  assert 'secure_lower_clipped_count=int32' in released
  with pytest.raises(ValueError, match=r'^`record_aggregation_factory`.*'
                     r'release, without noise, how many clients it clamped'):
    dp.dp_factory('clip', record_aggregation_factory=secure_sum, **DP)


# With client noise a summand of the secure sum is a value of at most C in
# each coordinate plus that client's N(0, (z C / sqrt(n))^2) noise; clamped,
# the noise is not the Gaussian the ledger charges (a threshold at C keeps
# only noise pointing inward). The thresholds must reach C + 20 std: for
# DP's z = 0.5, n = 3, C = 1 that is 1 + 20 * 0.5 / sqrt(3) = 6.7735.
CLIENT_NOISE = dict(DP, noise_placement='client')
CLIENT_NOISE_REACH = 1.0 + 20.0 * 0.5 / np.sqrt(3.0)


@pytest.mark.parametrize('secure_sum, arguments', [
    (tff.aggregators.SecureSumFactory(1.0), {}),
    (tff.aggregators.SecureSumFactory(CLIENT_NOISE_REACH - 1e-3), {}),
    (tff.aggregators.SecureSumFactory(100.0, -CLIENT_NOISE_REACH + 1e-3), {}),
    (tff.aggregators.SecureSumFactory(100.0), dict(clip_norm='adaptive')),
    (tff.aggregators.SecureSumFactory(aggregators.constant_norm_process(
        100.0)), {}),
], ids=['at-C', 'just-short', 'lower-short', 'adaptive-norm', 'estimated'])
def test_a_secure_sum_that_could_clamp_client_noise_is_refused(
    secure_sum, arguments):
  with pytest.raises(ValueError, match=r"^`record_aggregation_factory`.*"
                     r"noise_placement='client'"):
    dp.dp_factory('clip', record_aggregation_factory=secure_sum,
                  **{**CLIENT_NOISE, **arguments})


def test_a_secure_sum_past_client_noises_reach_is_accepted():
  for secure_sum in (tff.aggregators.SecureSumFactory(CLIENT_NOISE_REACH +
                                                      1e-3),
                     # Central noise is added to the sum, after the clamp.
                     tff.aggregators.SecureSumFactory(1.0)):
    placement = ('client' if secure_sum._upper_bound_threshold > 1.0
                 else 'central')
    dp.dp_factory('clip', record_aggregation_factory=secure_sum,
                  **dict(DP, noise_placement=placement))


def test_a_secure_sum_that_holds_the_counts_gives_the_mean_present():
  from tff_clip.runtime import execution  # pylint: disable=g-import-not-at-top
  values = [np.array([0.3, 0.1], np.float32), np.array([0.1, 0.3], np.float32)]
  process = dp.dp_factory(
      'clip', noise_multiplier=0.0, clients_per_round=2.0, clip_norm=1.0,
      denominator='actual', record_aggregation_factory=(
          tff.aggregators.SecureSumFactory(1.0))).create(
              tff.types.TensorType(np.float32, [2]))
  tff.backends.test.set_sync_test_cpp_execution_context()  # Runs secure sums.
  try:
    output = process.next(process.initialize(), values)
  finally:
    execution.set_local_cpp_context()
  np.testing.assert_allclose(output.result, np.mean(values, axis=0),
                             atol=1e-6)


@pytest.mark.parametrize('row, threshold, arguments', [
    ('(0.25)`', 0.25, dict(DP, clip_norm='adaptive')),
    ("(1.0)` with `noise_placement='client'`", 1.0, CLIENT_NOISE),
    ('(0.5)` with a fixed `clip_norm=1.0`', 0.5, DP),
], ids=['counts', 'client-noise', 'reach'])
def test_the_documented_secure_sum_refusals_are_what_is_raised(
    row, threshold, arguments):
  with pytest.raises(ValueError) as raised:
    dp.dp_factory('clip', record_aggregation_factory=(
        tff.aggregators.SecureSumFactory(threshold)), **arguments)
  assert f'ValueError: {raised.value}' == _docs_line(
      '| `record_aggregation_factory=tff.aggregators.SecureSumFactory' + row)
