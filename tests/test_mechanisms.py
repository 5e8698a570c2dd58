"""Specification of the registries (`tff_clip.aggregation.mechanisms`): a bounding and a
noise mechanism are each one class, found by its public name, and the rest of
the library asks the object.

Oracles: the built-in classes themselves, composed by hand (a toy mechanism
twice independent noise must release exactly twice its noise; a toy bounding
that clips at C/2 must release exactly the clip at C/2), and the declared
defaults read back from `dataclasses.fields`. Eager queries only: no TFF
process is built.
"""

import ast
import collections
import dataclasses
import inspect
import pathlib
import re

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.aggregation import bounding
from tff_clip.aggregation import boundings
from tff_clip.aggregation import dp
from tff_clip.aggregation import mechanisms
from tff_clip.aggregation import noise_mechanisms
from tff_clip.aggregation import spec
from tff_clip.program import config as config_lib

VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    a=(np.float32, [300]), b=(np.float32, [20, 5])))
SPECS = tff.types.type_to_tf_tensor_specs(VALUE_TYPE)


class Doubled(noise_mechanisms.NoiseMechanism):
  """Independent noise of twice the scale (a toy), accounted as such."""

  name = 'doubled'
  participation_sensitivity = 0.5

  def unit_noise(self, structure, key, round_num, state):
    noise, state = noise_mechanisms.Independent().unit_noise(
        structure, key, round_num, state)
    return tf.nest.map_structure(lambda x: 2.0 * x, noise), state

  def whitening_weights(self, round_num):
    return tf.ones([1], tf.float32)

  def noise_covariance(self, rounds):
    return 4.0 * np.eye(rounds)


class HalfClip(boundings.Bounding):
  """Clipping at half the clip norm (a toy)."""

  name = 'half_clip'

  def factor(self, norm, target):
    return boundings.Clip().factor(norm, target / 2.0)


@pytest.fixture
def doubled():
  mechanisms.NOISE_MECHANISMS.register(Doubled)
  yield Doubled.name
  mechanisms.NOISE_MECHANISMS.unregister(Doubled.name)


@pytest.fixture
def half_clip():
  mechanisms.BOUNDINGS.register(HalfClip)
  yield HalfClip.name
  mechanisms.BOUNDINGS.unregister(HalfClip.name)


def _released(factory, rounds=2):
  """The released means of `rounds` rounds without clients, and events."""
  query = factory.build_query(VALUE_TYPE)
  state, outputs, events = query.initial_global_state(), [], []
  for _ in range(rounds):
    result, state, event = query.get_noised_result(
        query.initial_sample_state(SPECS), state)
    outputs.append(np.concatenate([np.ravel(x) for x in
                                   tf.nest.flatten(result)]))
    events.append(event)
  return np.array(outputs), events


def _dp(**overrides):
  arguments = dict(noise_multiplier=1.5, clients_per_round=1.0, clip_norm=2.0,
                   noise_seed=5)
  arguments.update(overrides)
  return dp.dp_factory(arguments.pop('bounding_method', 'clip'), **arguments)


# ----------------------------------------------------------------------------
# Unknown names.


def test_unknown_noise_mechanism_is_refused_with_the_known_ones():
  with pytest.raises(ValueError) as raised:
    _dp(noise_mechanism='blt_typo')
  assert str(raised.value) == (
      '`noise_mechanism` must be one of '
      f'{", ".join(mechanisms.NOISE_MECHANISMS)}; got \'blt_typo\'.')


@pytest.mark.parametrize('lookup', [
    lambda: _dp(bounding_method='normalise'),
    lambda: bounding.bound([tf.ones([3])], 'normalise', clip_norm=1.0),
])
def test_unknown_bounding_is_refused_with_the_known_ones(lookup):
  with pytest.raises(ValueError, match=re.escape(
      f'must be one of {", ".join(mechanisms.BOUNDINGS)}; got '
      "'normalise'")):
    lookup()


def test_an_option_of_no_noise_mechanism_is_refused():
  with pytest.raises(TypeError, match='`blt_bufers` is an option of no noise '
                     'mechanism'):
    mechanisms.noise_mechanism('banded', 2, blt_bufers=3)


def test_a_name_is_registered_once():
  with pytest.raises(ValueError, match="'clip' is already registered"):
    mechanisms.BOUNDINGS.register(type('Again', (boundings.Clip,), {}))


# ----------------------------------------------------------------------------
# One class and one registry line.


def test_a_registered_noise_mechanism_is_what_dp_factory_adds_and_records(
    doubled):
  ours, events = _released(_dp(noise_mechanism=doubled))
  independent, _ = _released(_dp())
  np.testing.assert_array_equal(ours, 2.0 * independent)
  assert events == [dp_accounting.GaussianDpEvent(3.0)] * 2


def test_a_registered_noise_mechanism_is_accounted_from_its_own_events(
    doubled):
  from tff_clip.privacy import accounting  # pylint: disable=g-import-not-at-top
  event = accounting.correlated_training_event(doubled, 1.5, 1, 10, 5)
  assert event == dp_accounting.SelfComposedDpEvent(
      dp_accounting.GaussianDpEvent(3.0), 2)


def test_a_registered_bounding_is_applied_as_itself_never_as_normalize(
    half_clip):
  small = [tf.constant([0.3, 0.0, 0.4])]  # Norm 0.5: below every bound.
  large = [tf.constant([30.0, 0.0, 40.0])]
  for update in (small, large):
    ours = bounding.bound(update, half_clip, clip_norm=2.0).value
    clipped = bounding.bound(update, 'clip', clip_norm=1.0).value
    np.testing.assert_array_equal(ours[0], clipped[0])
  np.testing.assert_array_equal(
      bounding.bound(small, half_clip, clip_norm=2.0).value[0], small[0])


def test_a_registered_bounding_is_what_dp_factory_bounds_with(half_clip):
  record = collections.OrderedDict(a=np.full([300], 1.0, np.float32),
                                   b=np.full([20, 5], 1.0, np.float32))
  bounded = []
  for method, clip_norm in ((half_clip, 2.0), ('clip', 1.0)):
    query = _dp(bounding_method=method, clip_norm=clip_norm,
                noise_multiplier=0.0).build_query(VALUE_TYPE)
    params = query.derive_sample_params(query.initial_global_state())
    bounded.append(tf.nest.map_structure(
        np.asarray, query.preprocess_record(params, record)))
  tf.nest.map_structure(np.testing.assert_array_equal, *bounded)


# ----------------------------------------------------------------------------
# One home for the DP parameters and their defaults.


def test_dp_factory_signature_is_the_declared_parameters():
  parameters = inspect.signature(dp.dp_factory).parameters
  declared = dataclasses.fields(spec.DPSpec)
  assert list(parameters)[:len(declared)] == [f.name for f in declared]
  for field in declared[1:]:
    wanted = (inspect.Parameter.empty if field.default is dataclasses.MISSING
              else field.default)
    assert parameters[field.name].default == wanted, field.name


# A run's own: z may be 'none' or calibrated, n is an int, T the run's, its
# separation defaults to --bands under --sampling=min_separation.
RUN_OWN = ('noise_multiplier', 'clients_per_round', 'rounds', 'min_separation')


def test_every_train_config_dp_field_has_the_declared_default_and_help():
  shared = [f for f in dataclasses.fields(config_lib.TrainConfig)
            if f.name in spec.PARAMETERS and f.name not in RUN_OWN]
  # Every DP parameter with a default is a flag.
  assert {f.name for f in shared} == {
      name for name in spec.PARAMETERS if name not in RUN_OWN and
      spec.parameter(name).default is not dataclasses.MISSING}
  for field in shared:
    declared = spec.parameter(field.name)
    assert field.default == declared.default, field.name
    assert field.metadata['choices'] == declared.metadata['choices']
    assert field.metadata['help'] == re.sub(
        r'`(\w+)`', r'--\1', declared.metadata['help'])


def test_train_config_choices_are_the_registered_names():
  choices = {f.name: f.metadata['choices']
             for f in dataclasses.fields(config_lib.TrainConfig)}
  assert choices['noise_mechanism'] == mechanisms.NOISE_MECHANISMS.names
  assert set(mechanisms.BOUNDINGS) <= set(choices['bounding'])


def test_the_run_spec_is_the_flags_spec():
  config = config_lib.TrainConfig(
      bounding='per_layer_clip', clip_norm=2.0, target_quantile=0.4,
      noise_mechanism='banded', bands=3, sampling='min_separation',
      min_separation=4, rounds=12, clients_per_round=7)
  made = config.dp_spec(1.25)
  assert made == spec.DPSpec(
      'per_layer_clip', 1.25, 7, clip_norm=2.0, target_quantile=0.4,
      noise_mechanism='banded', bands=3, rounds=12, min_separation=4)
  assert made.noise.participations == 3


# ----------------------------------------------------------------------------
# Each check names the one thing wrong.


def test_banded_noise_without_minimum_separation_says_just_that():
  with pytest.raises(config_lib.ConfigError) as raised:
    config_lib.validate(config_lib.TrainConfig(noise_mechanism='banded',
                                               bands=2))
  message = str(raised.value)
  assert message.startswith(
      '--noise_mechanism=banded needs --sampling=min_separation:')
  for other in ('--noise_placement', '--bounding', '--noise_multiplier'):
    assert other not in message


def test_correlated_noise_with_client_placement_says_just_that():
  with pytest.raises(ValueError) as raised:
    _dp(noise_mechanism='tree', bands=2, noise_placement='client')
  assert str(raised.value).startswith(
      '`noise_mechanism`=tree needs `noise_placement`=central:')


def test_bands_beyond_the_separation_names_both_flags():
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      '--bands (4) must be at most the participation --min_separation (3)')):
    config_lib.validate(config_lib.TrainConfig(
        noise_mechanism='banded', bands=4, sampling='min_separation',
        min_separation=3))


# ----------------------------------------------------------------------------
# No code outside the registries branches on a mechanism's or a bounding's
# name: it asks the object (a new mechanism then needs no edit elsewhere).

_REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
# The registries themselves, and the classes whose `name` they register.
_REGISTRY_FILES = frozenset(
    pathlib.Path(module.__file__).resolve()
    for module in (mechanisms, boundings))
# A paper's figure, drawn as the paper draws it: its two curves are labelled
# and styled by the paper's own method names (Das et al. 2022, Fig. 1).
_PAPER_FIGURES = frozenset({'scripts/reproduce/paper003.py'})


def _strings(node):
  """The string constants `node` is or holds (a tuple, list or set of them)."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return [node.value]
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return [s for element in node.elts for s in _strings(element)]
  return []


def _name_comparisons(source: str, registered: frozenset[str]):
  """(line, names) of each ==, !=, in, not in whose operands include a
  registered name as a string constant and something else."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Compare) or not all(
        isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
        for op in node.ops):
      continue
    operands = [node.left, *node.comparators]
    names = sorted({s for operand in operands for s in _strings(operand)}
                   & registered)
    if names and any(not _strings(operand) for operand in operands):
      found.append((node.lineno, names))
  return found


def test_the_scan_finds_a_comparison_with_a_registered_name():
  registered = frozenset({'banded', 'clip'})
  source = ("if mechanism == 'banded': pass\n"
            "x = method in ('clip', 'other')\n"
            "y = 'banded' if flag else 'tree'\n"
            "z = mode == 'other'\n")
  assert _name_comparisons(source, registered) == [(1, ['banded']),
                                                   (2, ['clip'])]


def test_no_code_outside_the_registries_compares_a_name_with_a_registered_one():
  registered = frozenset(mechanisms.NOISE_MECHANISMS.names
                         + mechanisms.BOUNDINGS.names)
  found = []
  for folder in ('tff_clip', 'scripts', 'tasks'):
    for path in sorted((_REPOSITORY / folder).rglob('*.py')):
      relative = path.relative_to(_REPOSITORY).as_posix()
      if path.resolve() in _REGISTRY_FILES or relative in _PAPER_FIGURES:
        continue
      for line, names in _name_comparisons(path.read_text(), registered):
        found.append(f'{relative}:{line} compares with {names}')
  assert not found, ('Ask the mechanism or bounding object (an attribute or '
                     'method of its class) instead:\n' + '\n'.join(found))
