"""Calibrated noise multipliers on disk: reused when the accountant confirms
them, recalibrated when not (`tff_clip.program.calibration_cache`).

The oracle for "what calibration gives" is `accounting.calibrate_noise_multiplier`
called directly with the accountant the run reports (PLD under Poisson
sampling); the oracle for a z's epsilon is dp_accounting's own PLD
accountant on the Poisson-subsampled Gaussian event, built here (on a finer
grid than the program's: within 0.1% of its figure).
"""

import dataclasses
import json
import os
import signal
import stat

import dp_accounting
import pytest

from tff_clip.privacy import accounting
from tff_clip.program import calibration_cache
from tff_clip.program import preflight
from tff_clip.program.config import TrainConfig

POPULATION = 1000
CONFIG = TrainConfig(noise_multiplier=None, target_epsilon=4.0, rounds=10,
                     clients_per_round=20)


def _epsilon(z: float) -> float:
  """dp_accounting's PLD epsilon of CONFIG's rounds at noise multiplier z."""
  event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
          CONFIG.clients_per_round / POPULATION,
          dp_accounting.GaussianDpEvent(z)), CONFIG.rounds)
  accountant = dp_accounting.pld.PLDAccountant(
      value_discretization_interval=1e-4)
  return accountant.compose(event).get_epsilon(CONFIG.delta)


@pytest.fixture(scope='module')
def calibrated_z():
  # A run aims a little below its target (float32's room in the aggregator,
  # docs/privacy.md).
  return accounting.calibrate_noise_multiplier(
      CONFIG.target_epsilon * (1 - 2.0**-16), CONFIG.clients_per_round,
      POPULATION,
      CONFIG.rounds, CONFIG.delta, accountant=accounting.PLD)


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """An empty on-disk cache, nothing calibrated in this process, and the
  list of the accountant's calibrations made."""
  monkeypatch.setenv('TFF_CLIP_GRAPH_CACHE', str(tmp_path))
  monkeypatch.setattr(preflight, '_CALIBRATED', {})
  calls = []
  real = accounting.calibrate_noise_multiplier

  def counted(*args, **kwargs):
    calls.append(kwargs)
    return real(*args, **kwargs)

  monkeypatch.setattr(accounting, 'calibrate_noise_multiplier', counted)
  return calls


def _resolve(config=CONFIG):
  preflight._CALIBRATED.clear()  # A new process: only the disk remembers.
  return preflight.resolve_noise_multiplier(config, POPULATION)


def _entry():
  entries = list((calibration_cache.path_of('x').parent).glob('*.json'))
  assert len(entries) == 1
  return entries[0]


def _stored(z):
  """The entry an earlier process that calibrated CONFIG to `z` left."""
  name, arguments = preflight._calibration(CONFIG, POPULATION)
  calibration_cache._store(calibration_cache.entry_key(name, arguments), z)
  return _entry()


def test_a_second_process_reads_what_the_first_calibrated(cache, calibrated_z):
  assert _resolve() == calibrated_z
  assert _resolve() == calibrated_z
  assert len(cache) == 1
  assert _stored(calibrated_z) == _entry()  # The same entry.
  assert _epsilon(calibrated_z) <= CONFIG.target_epsilon


def test_an_entry_is_readable_by_its_owner_only(cache):
  _resolve()
  path = _entry()
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
  assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


# A 0.1% lower z is caught in the default suite; 1% (further above the
# target: the same refusal, the same oracle) in the slow suite.
@pytest.mark.parametrize('factor', [
    pytest.param(0.99, marks=pytest.mark.slow), 0.999])
def test_an_entry_edited_to_lower_the_noise_is_recalibrated(
    cache, calibrated_z, factor):
  path = _stored(calibrated_z)
  entry = json.loads(path.read_text())
  entry['noise_multiplier'] = calibrated_z * factor
  path.write_text(json.dumps(entry))
  # The edited z would release more than the target: a privacy error.
  assert _epsilon(calibrated_z * factor) > CONFIG.target_epsilon
  assert _resolve() == calibrated_z
  assert len(cache) == 1
  assert json.loads(path.read_text())['noise_multiplier'] == calibrated_z


def test_an_entry_edited_to_raise_the_noise_is_recalibrated(cache, calibrated_z):
  path = _stored(calibrated_z)
  entry = json.loads(path.read_text())
  entry['noise_multiplier'] = calibrated_z * 1.01
  path.write_text(json.dumps(entry))
  assert _resolve() == calibrated_z
  assert len(cache) == 1


@pytest.mark.parametrize('damage', [
    lambda entry: 'not json {',
    lambda entry: json.dumps(dict(entry, key='0' * 64)),
    lambda entry: json.dumps(dict(entry, format='another')),
    lambda entry: json.dumps({k: v for k, v in entry.items()
                              if k != 'noise_multiplier'}),
    lambda entry: json.dumps(dict(entry, noise_multiplier='NaN')),
    lambda entry: json.dumps(dict(entry, noise_multiplier=-1.0)),
    lambda entry: json.dumps([entry]),
    # Beyond what training can add (float32 overflows, subnormal): the
    # accountant refuses them, and the entry is recalibrated, not the run.
    lambda entry: json.dumps(dict(entry, noise_multiplier=1e39)),
    lambda entry: json.dumps(dict(entry, noise_multiplier=1e-300)),
], ids=['garbage', 'another_key', 'another_format', 'no_value', 'nan',
        'negative', 'not_an_object', 'float32_overflow', 'subnormal'])
def test_a_damaged_or_stale_entry_is_recalibrated(cache, calibrated_z, damage):
  path = _stored(calibrated_z)
  path.write_text(damage(json.loads(path.read_text())))
  assert _resolve() == calibrated_z
  assert len(cache) == 1
  assert json.loads(path.read_text())['noise_multiplier'] == calibrated_z


def test_with_the_cache_off_nothing_is_written(cache, monkeypatch, tmp_path,
                                               calibrated_z):
  monkeypatch.setenv('TFF_CLIP_GRAPH_CACHE', 'off')
  assert calibration_cache.path_of('x') is None
  assert _resolve() == calibrated_z
  assert _resolve() == calibrated_z
  assert len(cache) == 2
  assert not list(tmp_path.iterdir())


def test_what_calibration_is_a_function_of_decides_the_entry(monkeypatch):
  """A sweep's seeds, learning rates, quantiles and run directories share
  one calibration; rounds, cohort, delta, the target do not."""
  monkeypatch.setattr(preflight, '_CALIBRATED', {})
  cache = []
  monkeypatch.setattr(accounting, 'calibrate_noise_multiplier',
                      lambda *args, **kwargs: cache.append(kwargs) or 1.25)
  for changed in [dict(seed=3), dict(server_learning_rate=0.25),
                  dict(target_quantile=0.1), dict(experiment_name='other',
                                                  root_output_dir='/tmp/x')]:
    preflight.resolve_noise_multiplier(dataclasses.replace(CONFIG, **changed),
                                       POPULATION)
  assert len(cache) == 1
  for changed in [dict(rounds=11), dict(clients_per_round=21),
                  dict(delta=1e-6), dict(target_epsilon=4.5)]:
    preflight.resolve_noise_multiplier(dataclasses.replace(CONFIG, **changed),
                                       POPULATION)
  assert len(cache) == 5
  assert [call['rounds'] for call in cache] == [10, 11, 10, 10, 10]


def test_a_min_separation_entry_lowered_by_1_percent_is_recalibrated(
    cache, monkeypatch):
  """The mechanism's calibration (minimum-separation participation) is
  cached and checked the same way, with the mechanism's own event."""
  config = dataclasses.replace(CONFIG, sampling='min_separation',
                               min_separation=5)
  accountant = accounting.reporting_accountant(
      config.noise.training_event(1.0))
  expected = accounting.calibrate_mechanism_noise_multiplier(
      config.target_epsilon * (1 - 2.0**-16), config.noise, config.delta,
      accountant=accountant)
  preflight._CALIBRATED.clear()
  assert preflight.resolve_noise_multiplier(config, POPULATION) == expected
  path = _entry()
  entry = json.loads(path.read_text())
  entry['noise_multiplier'] = expected * 0.99
  path.write_text(json.dumps(entry))
  assert accounting.compute_epsilon(
      config.noise.training_event(expected * 0.99),
      config.delta, accountant).epsilon > config.target_epsilon
  calls = []
  real = accounting.calibrate_mechanism_noise_multiplier
  monkeypatch.setattr(accounting, 'calibrate_mechanism_noise_multiplier',
                      lambda *a, **k: calls.append(a) or real(*a, **k))
  preflight._CALIBRATED.clear()
  assert preflight.resolve_noise_multiplier(config, POPULATION) == expected
  assert len(calls) == 1
  preflight._CALIBRATED.clear()
  assert preflight.resolve_noise_multiplier(config, POPULATION) == expected
  assert len(calls) == 1  # The rewritten entry, checked and used.


class _Hung(Exception):
  """The watchdog's: the calibration waited on a file that never answers."""


def test_an_entry_in_a_folder_others_may_write_is_never_opened(
    cache, calibrated_z, tmp_path):
  """TFF_CLIP_GRAPH_CACHE in a folder others may write (made first by
  another user, say): what they put at an entry's name is never opened, as
  the graph cache's entries are not. A FIFO there made the open wait for a
  writer forever, and the run with it; the run calibrates instead."""
  name, arguments = preflight._calibration(CONFIG, POPULATION)
  entry = calibration_cache.path_of(calibration_cache.entry_key(name,
                                                                arguments))
  entry.parent.mkdir()
  os.mkfifo(entry)
  for folder in (tmp_path, entry.parent):
    os.chmod(folder, 0o777)

  def hung(*_):
    raise _Hung(f'{entry} was opened')

  previous = signal.signal(signal.SIGALRM, hung)
  signal.alarm(30)  # A watchdog, not a wait: the test fails, never hangs.
  try:
    assert _resolve() == calibrated_z
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
  assert len(cache) == 1
