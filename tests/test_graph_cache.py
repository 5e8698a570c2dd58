"""The on-disk cache of traced graphs (`tff_clip.runtime.graph_cache`).

An entry is used only when its key and checksum say it is the one asked for;
a damaged or stale one is rebuilt, and a run from the cache is the run
without it, bit for bit. No secret reaches a cache file.
"""

import os
import stat

import numpy as np
import pytest

from tff_clip.runtime import graph_cache

_ENTRY = {'process/work': b'\x00graph bytes\xff', 'process/next_type': b'type'}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  directory = tmp_path / 'graphs'
  monkeypatch.setenv(graph_cache.ENV, str(directory))
  return directory


def _key(text):
  return graph_cache.entry_key(text)


def test_an_entry_reads_back_as_written_owner_only(cache_dir):
  key = _key('a')
  assert graph_cache.store(key, _ENTRY)
  assert graph_cache.load(key) == _ENTRY
  (path,) = cache_dir.iterdir()
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
  assert stat.S_IMODE(os.stat(cache_dir).st_mode) == 0o700


@pytest.mark.parametrize('offset', [0, 30, 100, -1])
def test_an_entry_with_a_flipped_byte_is_not_used(cache_dir, offset):
  key = _key('a')
  graph_cache.store(key, _ENTRY)
  (path,) = cache_dir.iterdir()
  data = bytearray(path.read_bytes())
  data[offset] ^= 0x01
  path.write_bytes(bytes(data))
  assert graph_cache.load(key) is None


def test_a_truncated_entry_is_not_used(cache_dir):
  key = _key('a')
  graph_cache.store(key, _ENTRY)
  (path,) = cache_dir.iterdir()
  path.write_bytes(path.read_bytes()[:-3])
  assert graph_cache.load(key) is None


def test_an_entry_under_another_key_is_not_used(cache_dir):
  graph_cache.store(_key('a'), _ENTRY)
  (path,) = cache_dir.iterdir()
  stale = _key('b')
  path.rename(cache_dir / f'{stale}.graphs')
  assert graph_cache.load(stale) is None


def test_the_key_changes_with_the_library_source(monkeypatch):
  before = _key('a')
  monkeypatch.setattr(graph_cache, 'library_hash', lambda: '0' * 64)
  assert _key('a') != before


def test_an_overwritten_entry_is_the_new_one(cache_dir):
  key = _key('a')
  graph_cache.store(key, {'x': b'old'})
  graph_cache.store(key, _ENTRY)
  assert graph_cache.load(key) == _ENTRY
  assert [p.name for p in cache_dir.iterdir()] == [f'{key}.graphs']


def test_off_stores_and_loads_nothing(tmp_path, monkeypatch):
  monkeypatch.setenv(graph_cache.ENV, 'off')
  assert graph_cache.directory() is None
  assert not graph_cache.store(_key('a'), _ENTRY)
  assert graph_cache.load(_key('a')) is None


def test_the_test_suite_leaves_the_users_cache_alone():
  # tests/conftest.py; the tests above point it at a temporary directory.
  assert os.environ[graph_cache.ENV] == 'off'


def test_a_fixed_noise_seed_is_never_cached(cache_dir):
  from tff_clip.program import assembly
  from tff_clip.program.config import TrainConfig
  from scripts import program
  config = TrainConfig()
  assert assembly._graph_cache_key(config, program.build_task, 1.0)
  assert assembly._graph_cache_key(
      TrainConfig(noise_seed=7), program.build_task, 1.0) is None


def test_a_graph_with_a_seed_fixed_at_tracing_is_never_cached():
  import tensorflow as tf
  import tensorflow_federated as tff

  @tff.tensorflow.computation
  def seeded():
    return tf.random.uniform([2], seed=3)

  @tff.tensorflow.computation
  def unseeded():
    return tf.random.uniform([2])

  proto = tff.framework.serialize_computation
  with tf.Graph().as_default():  # No global seed set by other tests.
    assert graph_cache.has_baked_seed([proto(seeded)])
    assert not graph_cache.has_baked_seed([proto(unseeded)])


# ----------------------------------------------------------------------------
# Sessions built from the cache (each builds a process: slow).


def _leaves(session, state):
  return [np.asarray(x) for x in session.state_leaves(state)]


def _rounds(session, state, rounds=2):
  """`rounds` rounds from `state`: the final state's leaves, the metrics."""
  from tff_clip.program import program_logic
  metrics = []
  for round_num in range(1, rounds + 1):
    cohort = session.sampler.sample(round_num)
    output = session.process.next(state, [
        session.client_datasets.dataset(c, round_num) for c in cohort])
    state = output.state
    metrics.append(program_logic.flatten_metrics(output.metrics))
  return _leaves(session, state), metrics, session.evaluate(state), state


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  """A cold session (which fills the cache), then one from the cache."""
  from scripts import program
  from tff_clip.program import assembly
  from tff_clip.program.config import TrainConfig
  directory = tmp_path_factory.mktemp('graph_cache')
  monkeypatch = pytest.MonkeyPatch()
  monkeypatch.setenv(graph_cache.ENV, str(directory))
  config = TrainConfig(clients_per_round=4, num_clients=20)
  traced = []
  original = assembly.build_process
  monkeypatch.setattr(assembly, 'build_process',
                      lambda *a, **k: traced.append(1) or original(*a, **k))
  cold = assembly.Session(config, program.build_task)
  entries = sorted(directory.iterdir())
  warm = assembly.Session(config, program.build_task)
  yield dict(cold=cold, warm=warm, traced=traced, directory=directory,
             entries=entries, config=config, monkeypatch=monkeypatch)
  monkeypatch.undo()


@pytest.mark.slow
def test_a_cold_session_fills_the_cache_and_a_warm_one_traces_nothing(built):
  assert len(built['entries']) == 1
  assert built['traced'] == [1]


@pytest.mark.slow
def test_a_session_from_the_cache_runs_bit_for_bit_as_a_traced_one(built):
  cold, warm = built['cold'], built['warm']
  state = cold.initial_state()  # One noise key for both.
  cold_leaves, cold_metrics, cold_eval, cold_state = _rounds(cold, state)
  warm_leaves, warm_metrics, warm_eval, warm_state = _rounds(warm, state)
  for a, b in zip(cold_leaves, warm_leaves, strict=True):
    np.testing.assert_array_equal(a, b)
  assert repr(cold_metrics) == repr(warm_metrics)
  assert repr(cold_eval) == repr(warm_eval)
  assert cold.round_event(cold_state, 2) == warm.round_event(warm_state, 2)


def _noise_key(value):
  """The aggregator state's `noise_key` (int64[2]), wherever it sits."""
  if hasattr(value, 'noise_key'):
    return np.asarray(value.noise_key)
  children = (value.values() if isinstance(value, dict) else
              value if isinstance(value, (list, tuple)) else ())
  for child in children:
    found = _noise_key(child)
    if found is not None:
      return found
  return None


@pytest.mark.slow
def test_no_cache_file_holds_the_runs_noise_key(built):
  warm = built['warm']
  state = warm.initial_state()
  key = _noise_key(state.aggregator)
  assert key is not None and key.dtype == np.int64 and np.any(key != 0)
  data = b''.join(p.read_bytes() for p in built['directory'].iterdir())
  for word in key:
    for order in ('<', '>'):
      assert np.array([word], order + 'i8').tobytes() not in data
    assert str(int(word)).encode() not in data


@pytest.mark.slow
def test_a_damaged_entry_is_rebuilt_and_replaced(built):
  from scripts import program
  from tff_clip.program import assembly
  (path,) = built['entries']
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x40
  path.write_bytes(bytes(data))
  before = len(built['traced'])
  rebuilt = assembly.Session(built['config'], program.build_task)
  assert len(built['traced']) == before + 1
  assert path.read_bytes() != bytes(data)
  state = built['cold'].initial_state()
  for a, b in zip(_rounds(built['cold'], state, 1)[0],
                  _rounds(rebuilt, state, 1)[0], strict=True):
    np.testing.assert_array_equal(a, b)
  assembly.Session(built['config'], program.build_task)
  assert len(built['traced']) == before + 1  # The new entry is used.


@pytest.mark.slow
def test_an_entry_of_another_library_version_is_not_used(built):
  from scripts import program
  from tff_clip.program import assembly
  before = len(built['traced'])
  library_hash = graph_cache.library_hash
  graph_cache.library_hash = lambda: 'f' * 64
  try:
    assembly.Session(built['config'], program.build_task)
  finally:
    graph_cache.library_hash = library_hash
  assert len(built['traced']) == before + 1


@pytest.mark.slow
def test_a_fresh_process_runs_from_the_entry_another_wrote(tmp_path):
  # Nothing traced in the second process: not even the aggregator's modules
  # are imported when its state's containers are looked up.
  import pathlib
  import subprocess
  import sys
  directory = tmp_path / 'graphs'
  env = dict(os.environ, **{graph_cache.ENV: str(directory)})
  def train(name):
    return subprocess.run(
        [sys.executable, '-m', 'scripts.train', '--rounds=1',
         '--progress=false', f'--root_output_dir={tmp_path / name}'],
        cwd=pathlib.Path(__file__).parent.parent, env=env,
        capture_output=True, text=True, check=True)
  train('cold')
  (entry,) = directory.iterdir()
  written = os.stat(entry)
  warm = train('warm')
  assert 'Graph cache' not in warm.stderr
  assert os.stat(entry).st_ino == written.st_ino  # Not rewritten.
