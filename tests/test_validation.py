"""Specification: every bad library argument is refused at construction,
naming it, and every number is checked in the dtype it will be used in.

A float that overflows float32 (1e39 -> inf) or underflows it (1e-50 -> 0)
would silently zero every update or remove the noise; such values are
refused, never cast. Oracle: numpy's float32 conversion.
"""

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_clip import checks
from tff_clip.aggregation import aggregators
from tff_clip.aggregation import dp

VALUE = tff.TensorType(np.float32, [3])
PRIVACY = dict(noise_multiplier=1.0, clients_per_round=10.0, clip_norm=1.0)


@pytest.mark.parametrize('value', [1e39, 3.5e38, 1e-50, 1e-46])
def test_a_float_that_float32_cannot_hold_is_refused(value):
  with np.errstate(over='ignore'):
    assert not np.isfinite(np.float32(value)) or np.float32(value) == 0
  with pytest.raises(ValueError, match='`x`.*float32'):
    checks.positive_float(value, 'x')


def test_a_float32_subnormal_or_huge_finite_value_is_kept():
  for value in (1e-40, 3.4e38):
    assert np.isfinite(np.float32(value)) and np.float32(value) > 0
    assert checks.positive_float(value, 'x') == value


@pytest.mark.parametrize('changes, error, argument', [
    (dict(noise_multiplier=1e39), ValueError, 'noise_multiplier'),
    (dict(noise_multiplier=1e-50), ValueError, 'noise_multiplier'),
    (dict(noise_multiplier=float('nan')), ValueError, 'noise_multiplier'),
    (dict(noise_multiplier='1.0'), TypeError, 'noise_multiplier'),
    (dict(noise_multiplier=True), TypeError, 'noise_multiplier'),
    (dict(clip_norm=1e39), ValueError, 'clip_norm'),
    (dict(clip_norm=1e-50), ValueError, 'clip_norm'),
    (dict(clients_per_round=1e-300), ValueError, 'clients_per_round'),
    (dict(clients_per_round=10**400), ValueError, 'clients_per_round'),
    (dict(noise_seed=2**70), ValueError, 'noise_seed'),
    (dict(noise_seed=2**63 - 1), ValueError, 'noise_seed'),  # seed + 1.
    (dict(noise_seed=1.5), TypeError, 'noise_seed'),
    (dict(noise_seed=False), TypeError, 'noise_seed'),
    (dict(clip_norm='adaptive', initial_clip_norm=1e39), ValueError,
     'initial_clip_norm'),
    (dict(clip_norm='adaptive', clip_learning_rate=1e-50), ValueError,
     'clip_learning_rate'),
    (dict(clip_norm='adaptive', clipped_count_stddev=1e39), ValueError,
     'clipped_count_stddev'),
    (dict(clip_norm='adaptive', per_layer_quantiles='no'), TypeError,
     'per_layer_quantiles'),
    (dict(clip_norm='adaptive', per_layer_quantiles=0), TypeError,
     'per_layer_quantiles'),
])
def test_dp_factory_refuses_a_bad_argument_naming_it(changes, error,
                                                     argument):
  with pytest.raises(error, match=f'`{argument}`'):
    dp.dp_factory('per_layer_clip', **{**PRIVACY, **changes})


@pytest.mark.parametrize('value_type, problem', [
    (tff.TensorType(np.float32, [None]), 'fully defined shapes'),
    (tff.StructType([('w', tff.TensorType(np.float32, [2, None]))]),
     'fully defined shapes'),
    (tff.StructType([]), 'empty structure'),
])
@pytest.mark.parametrize('factory', [
    lambda: dp.dp_factory('clip', **PRIVACY),
    lambda: aggregators.clip_factory(1.0),
    lambda: aggregators.per_layer_normalize_factory(1.0),
])
def test_create_refuses_unknown_shapes_and_empty_structures_naming_it(
    factory, value_type, problem):
  with pytest.raises(ValueError, match=f'`value_type`.*{problem}'):
    factory().create(value_type)


def test_a_good_factory_still_builds():
  process = dp.dp_factory('clip', **PRIVACY).create(VALUE)
  assert process.initialize.type_signature is not None
