"""Specification of `tff_clip.aggregation.spec`: each rule of a DP aggregation, once.

`dp_factory`, the training program's flags (`tff_clip.program.config.validate`) and
the audit all read the one `DPSpec`; these tests hold them to it: the same
bad value is refused by each with the same sentence (the flags write the
argument as --name), and the spec needs no TensorFlow.
"""

import dataclasses
import re
import subprocess
import sys

import pytest

from tff_clip.aggregation import dp
from tff_clip.aggregation import spec
from tff_clip.program import config as config_lib

CHOICE_FIELDS = ('bounding', 'denominator', 'noise_placement')
GOOD = dict(bounding_method='clip', noise_multiplier=1.0, clients_per_round=20)

# (argument, bad value, TrainConfig field)
BAD = [
    ('bounding_method', 'clip_harder', 'bounding'),
    ('noise_multiplier', -1.0, 'noise_multiplier'),
    ('noise_multiplier', 1e39, 'noise_multiplier'),  # inf in float32
    ('clients_per_round', 0, 'clients_per_round'),
    ('clip_norm', 'auto', 'clip_norm'),
    ('clip_norm', 1e-50, 'clip_norm'),  # 0 in float32
    ('target_quantile', 1.5, 'target_quantile'),
    ('clip_learning_rate', 0.0, 'clip_learning_rate'),
    ('initial_clip_norm', -0.1, 'initial_clip_norm'),
    ('clipped_count_stddev', 0.01, 'clipped_count_stddev'),  # infeasible
    ('denominator', 'median', 'denominator'),
    ('noise_placement', 'server', 'noise_placement'),
    ('noise_seed', 2**70, 'noise_seed'),
    ('per_layer_quantiles', 'no', 'per_layer_quantiles'),
]


def _error(call):
  with pytest.raises((TypeError, ValueError)) as info:
    call()
  return info.value


@pytest.mark.parametrize('argument, value, field', BAD)
def test_factory_flags_and_spec_refuse_alike(argument, value, field):
  from_spec = _error(lambda: spec.DPSpec(**{**GOOD, argument: value}))
  from_factory = _error(lambda: dp.dp_factory(
      GOOD['bounding_method'], **{
          **{k: v for k, v in GOOD.items() if k != 'bounding_method'},
          argument: value}) if argument != 'bounding_method' else
                        dp.dp_factory(value, noise_multiplier=1.0,
                                      clients_per_round=20))
  config = config_lib.TrainConfig(**{
      'noise_multiplier': 1.0, 'clients_per_round': 20, 'bounding': 'clip',
      'clip_norm': 'adaptive', field: value})
  from_flags = _error(lambda: config_lib.validate(config))

  assert type(from_factory) is type(from_spec)
  assert str(from_factory) == str(from_spec)
  assert isinstance(from_flags, config_lib.ConfigError)
  name = 'bounding' if argument == 'bounding_method' else argument
  assert f'`{name}`' in str(from_spec)
  assert f'--{field}' in str(from_flags)
  if field not in CHOICE_FIELDS:  # Names are listed in tff_clip.names once.
    assert str(from_flags) == re.sub(r'`(\w+)`', r'--\1', str(from_spec))


def test_factory_holds_the_spec_it_was_made_from():
  factory = dp.dp_factory('per_layer_clip', noise_multiplier=0.5,
                          clients_per_round=10, clip_norm=2, split='uniform')
  assert factory.spec == spec.DPSpec('per_layer_clip', 0.5, 10.0, 2.0,
                                     'uniform')
  assert isinstance(factory.spec.clip_norm, float)  # Stored as checked.
  with pytest.raises(dataclasses.FrozenInstanceError):
    factory.spec.noise_multiplier = 0.0  # type: ignore[misc]


def test_client_rules_are_the_same_for_the_library_and_the_flags():
  from_spec = _error(lambda: spec.check_client_arguments(
      blur_strength=20.0, blur_clip_norm=1.0, client_learning_rate=0.1))
  config = config_lib.TrainConfig(blur_strength=20.0, clip_norm=1.0,
                                  client_learning_rate=0.1)
  from_flags = _error(lambda: config_lib.validate(config))
  assert '`blur_strength` = 20.0 must be < 1 / client_learning_rate' in str(
      from_spec)
  assert '--blur_strength = 20.0 must be < 1 / client_learning_rate' in str(
      from_flags)


def test_checking_a_configuration_imports_no_tensorflow():
  code = ('import sys\n'
          'from tff_clip.aggregation import spec; from tff_clip.program import config\n'
          'config.validate(config.TrainConfig(noise_multiplier=1.0))\n'
          'spec.DPSpec("per_layer_normalize", 1.0, 10, split=[1.0, 2.0])\n'
          'assert "tensorflow" not in sys.modules, "tensorflow imported"\n')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=60, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
