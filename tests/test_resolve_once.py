"""Specification: a run's mechanism is resolved once, into one frozen object.

The training program resolves the DP mechanism (the bounding that runs, the
target quantile and its switch, the adaptive norm's split of z between the
value and the clipped counts) once, from public numbers, before it builds
anything; the DP factory is built from that very object and the run records
it. A factory given a resolved object refuses one made for other numbers.
Oracle for the split: the closed form of Andrew et al. (2021),
z^-2 = z_v^-2 + k (2 sigma_b)^-2.
"""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.aggregation import dp
from tff_clip.aggregation import noise_following
from tff_clip.aggregation import spec as spec_lib

_VALUE = tff.StructType([tff.TensorType(np.float32, [3, 2]),
                         tff.TensorType(np.float32, [2])])


def _spec(**changes):
  fields = dict(noise_multiplier=1.0, clients_per_round=10.0,
                bounding_method='clip', clip_norm='adaptive')
  fields.update(changes)
  return spec_lib.DPSpec(**fields)


def test_the_split_is_andrew_et_als_closed_form():
  spec = _spec(clipped_count_stddev=2.0)
  resolved = noise_following.resolve(spec, 8, layers=2)
  assert resolved.clipped_count_stddev == 2.0
  assert resolved.value_noise_multiplier == pytest.approx(
      (1.0 - (2 * 2.0)**-2)**-0.5)
  # Per-layer quantiles: one count per layer, k = 2.
  per_layer = noise_following.resolve(
      _spec(bounding_method='per_layer_clip', per_layer_quantiles=True,
            clipped_count_stddev=2.0), 8, layers=2)
  assert per_layer.value_noise_multiplier == pytest.approx(
      (1.0 - 2 * (2 * 2.0)**-2)**-0.5)
  # A fixed norm: the value carries all of z, no count.
  fixed = noise_following.resolve(_spec(clip_norm=1.0), 8)
  assert (fixed.value_noise_multiplier, fixed.clipped_count_stddev) == (
      1.0, None)


@pytest.mark.parametrize('mechanism', [
    dict(noise_mechanism='banded', bands=4, min_separation=4),
    dict(noise_mechanism='blt', rounds=20, min_separation=5)])
def test_under_correlated_noise_value_and_count_spend_the_calibrated_gaussian(
    mechanism):
  # A participation releases the value through the mechanism (a Gaussian of
  # z_v / s, s its participation sensitivity) and the count with noise of
  # its own (one of 2 sigma_b): together the one Gaussian of z / s the run
  # was calibrated for. Oracle: dp_accounting's RDP of the pair against the
  # one Gaussian.
  import dp_accounting  # pylint: disable=g-import-not-at-top
  spec = _spec(clipped_count_stddev=2.0, **mechanism)
  s = spec.noise.participation_sensitivity
  assert s > 1.0
  resolved = noise_following.resolve(spec, 8)
  z_v, sigma_b = (resolved.value_noise_multiplier,
                  resolved.clipped_count_stddev)
  pair = dp_accounting.ComposedDpEvent([
      dp_accounting.GaussianDpEvent(z_v / s),
      dp_accounting.GaussianDpEvent(2 * sigma_b)])
  one = dp_accounting.GaussianDpEvent(1.0 / s)
  rdp = lambda e: dp_accounting.rdp.RdpAccountant().compose(e).get_epsilon(
      1e-5)
  assert rdp(pair) == pytest.approx(rdp(one), rel=1e-9)
  # Charged as under independent noise (s = 1), the pair spent less.
  assert z_v < (1.0 - (2 * 2.0)**-2)**-0.5


def test_a_factory_builds_its_query_from_the_object_it_was_given():
  spec = _spec()
  resolved = noise_following.resolve(spec, 8, layers=2)
  factory = dp.DPBoundingFactory(spec, resolved=resolved)
  assert factory.resolve(_VALUE) is resolved
  query = factory.build_query(_VALUE)
  state = query.initial_global_state()
  # The value noise of the query's state is the object's z_v (no second
  # derivation), the count noise its sigma_b.
  flat = {k: v for k, v in _items(state)}
  assert any(math.isclose(float(v), resolved.value_noise_multiplier,
                          rel_tol=1e-6)
             for k, v in flat.items() if k.endswith('noise_multiplier'))


def _items(value, prefix=''):
  if hasattr(value, '_asdict'):
    value = value._asdict()
  if isinstance(value, (dict, collections.OrderedDict)):
    for k, v in value.items():
      yield from _items(v, f'{prefix}.{k}')
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      yield from _items(v, f'{prefix}.{i}')
  elif tf.is_tensor(value) and value.shape.rank == 0:
    yield prefix, value.numpy()


@pytest.mark.parametrize('other', [
    dict(noise_multiplier=2.0), dict(clients_per_round=20.0)])
def test_a_resolution_of_other_numbers_is_refused_at_construction(other):
  resolved = noise_following.resolve(_spec(**other), 8, layers=2)
  with pytest.raises(ValueError, match='`resolved`'):
    dp.DPBoundingFactory(_spec(), resolved=resolved)


@pytest.mark.parametrize('dimension, layers', [(9, 2), (8, 1)])
def test_a_resolution_for_another_model_is_refused_at_create(dimension,
                                                             layers):
  spec = _spec()
  factory = dp.DPBoundingFactory(spec, resolved=noise_following.resolve(
      spec, dimension, layers=layers))
  with pytest.raises(ValueError, match='`resolved` was resolved for'):
    factory.create(_VALUE)


def test_a_session_resolves_once_and_records_the_object_its_factory_uses(
    monkeypatch):
  from scripts import program
  from tff_clip.program import assembly
  from tff_clip.program.config import TrainConfig
  from tff_clip.runtime import graph_cache
  monkeypatch.setenv(graph_cache.ENV, 'off')
  calls, given = [], []
  resolve = noise_following.resolve
  monkeypatch.setattr(noise_following, 'resolve',
                      lambda *a, **k: calls.append(1) or resolve(*a, **k))
  init = dp.DPBoundingFactory.__init__

  def spy(self, spec, record_aggregation_factory=None, resolved=None):
    given.append(resolved)
    init(self, spec, record_aggregation_factory, resolved)
  monkeypatch.setattr(dp.DPBoundingFactory, '__init__', spy)
  session = assembly.Session(
      TrainConfig(clients_per_round=4, num_clients=20, noise_multiplier=0.5,
                  rounds=2, client_execution='per_client'),
      program.build_task)
  assert len(calls) == 1
  assert given and all(r is session.mechanism for r in given)
  recorded = dict(session.resolved)
  for key, value in session.mechanism.to_dict().items():
    assert recorded[key] == value
