"""The on-disk cache of traced graphs (`tff_clip.runtime.graph_cache`).

An entry is used only when its key and checksum say it is the one asked for;
a damaged or stale one is rebuilt, and a run from the cache is the run
without it, bit for bit. No secret reaches a cache file.
"""

import collections
import dataclasses
import os
import stat

import numpy as np
import pytest

from tff_clip.program import process_cache
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


def test_an_entry_in_a_folder_others_may_write_is_not_used(cache_dir):
  """A shared folder made first by another user (TFF_CLIP_GRAPH_CACHE=/tmp/x)
  could hold graphs that drop the noise: its entries are never loaded."""
  key = _key('shared')
  assert graph_cache.store(key, _ENTRY)
  os.chmod(cache_dir, 0o777)
  assert graph_cache.load(key) is None
  os.chmod(cache_dir, 0o700)
  assert graph_cache.load(key) == _ENTRY


def test_an_entry_others_may_write_or_reached_by_a_link_is_not_used(
    cache_dir, tmp_path):
  key, other = _key('writable'), _key('linked')
  assert graph_cache.store(key, _ENTRY)
  path = cache_dir / f'{key}.graphs'
  os.chmod(path, 0o666)
  assert graph_cache.load(key) is None
  os.chmod(path, 0o600)
  assert graph_cache.load(key) == _ENTRY
  planted = tmp_path / 'planted.graphs'
  planted.write_bytes(path.read_bytes().replace(key.encode(), other.encode()))
  os.chmod(planted, 0o600)
  (cache_dir / f'{other}.graphs').symlink_to(planted)
  assert graph_cache.load(other) is None


@pytest.mark.skipif(os.getuid() != 0, reason='only root can give a file away')
def test_an_entry_another_user_owns_is_not_used(cache_dir):
  key = _key('theirs')
  assert graph_cache.store(key, _ENTRY)
  os.chown(cache_dir / f'{key}.graphs', 4242, -1)
  assert graph_cache.load(key) is None


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


def _locked_elsewhere(key) -> bool:
  """Whether another open file (as another process would hold it) holds
  the entry's lock: a non-blocking flock of our own is refused."""
  import fcntl  # pylint: disable=g-import-not-at-top
  descriptor = os.open(graph_cache.directory() / f'{key}.lock', os.O_RDWR)
  try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    return True
  finally:
    os.close(descriptor)
  return False


def test_an_entry_being_traced_is_locked_owner_only_until_the_block_ends(
    cache_dir):
  key = _key('traced')
  with graph_cache.entry_lock(key):
    assert _locked_elsewhere(key)
    mode = os.stat(cache_dir / f'{key}.lock').st_mode
    assert stat.S_IMODE(mode) == 0o600
  assert not _locked_elsewhere(key)
  with pytest.raises(RuntimeError):  # Released when the block raises too.
    with graph_cache.entry_lock(key):
      raise RuntimeError('a failed trace')
  assert not _locked_elsewhere(key)


def test_no_lock_is_waited_for_in_a_folder_others_may_write(cache_dir):
  """Another user's lock file, made and held in a shared cache folder,
  never holds the run: the entry is traced without the lock (no entry of
  that folder is loaded either)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  key = _key('shared')
  cache_dir.mkdir(parents=True, exist_ok=True)
  os.chmod(cache_dir, 0o777)
  held = os.open(cache_dir / f'{key}.lock', os.O_RDWR | os.O_CREAT, 0o666)

  class Hung(Exception):  # Not an OSError, which the lock would absorb.
    pass

  def hung(*_):
    raise Hung('waited for a lock in a shared folder')

  previous = signal.signal(signal.SIGALRM, hung)
  signal.alarm(20)  # A watchdog, not a wait: the test fails, never hangs.
  try:
    fcntl.flock(held, fcntl.LOCK_EX)  # The other user's, held.
    with graph_cache.entry_lock(key):
      pass
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
    os.close(held)


def _claim_in_thread(answers):
  """Runs `claimed_runner` in a thread against `answers` (what
  `cached_runner` answers, call by call); (thread, its findings, the event
  set once it first asked)."""
  import threading  # pylint: disable=g-import-not-at-top
  asked, found = threading.Event(), {}

  def fake_cached_runner(*args):
    del args
    asked.set()
    return answers.pop(0)

  def claim():
    with process_cache.claimed_runner(None, None, None, None, None) as got:
      found['runner'], found['key'] = got
      found['locked'] = _locked_elsewhere(_key('shape'))

  thread = threading.Thread(target=claim)
  return thread, found, asked, fake_cached_runner


def test_a_job_waiting_for_anothers_trace_takes_its_entry(cache_dir,
                                                          monkeypatch):
  """Two jobs of a sweep need one entry: the second waits on the first's
  lock, then asks again and takes the entry the first stored, untraced."""
  answers = [(None, _key('shape')), ('stored runner', None)]
  thread, found, asked, fake = _claim_in_thread(answers)
  monkeypatch.setattr(process_cache, 'cached_runner', fake)
  with graph_cache.entry_lock(_key('shape')):  # The first job, tracing.
    thread.start()
    assert asked.wait(60)  # The second found nothing, and waits.
    assert found == {}
  thread.join(60)
  assert (found['runner'], found['key']) == ('stored runner', None)
  assert not answers


def test_the_job_that_traces_holds_the_entrys_lock_while_it_does(
    cache_dir, monkeypatch):
  answers = [(None, _key('shape')), (None, _key('shape'))]
  thread, found, _, fake = _claim_in_thread(answers)
  monkeypatch.setattr(process_cache, 'cached_runner', fake)
  thread.start()
  thread.join(60)
  assert found == {'runner': None, 'key': _key('shape'), 'locked': True}
  assert not _locked_elsewhere(_key('shape'))


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
  assert process_cache.graph_cache_key(config, program.build_task, 1.0)
  assert process_cache.graph_cache_key(
      TrainConfig(noise_seed=7), program.build_task, 1.0) is None


# ----------------------------------------------------------------------------
# One entry per graph shape: the key holds what shapes the graphs, and no
# field that only chooses data, cohorts or initial weights.

# Each data-only field (`process_cache.DATA_ONLY`): two configurations that
# differ only in it (the first's fields, then the second's).
_DATA_ONLY_PAIRS = {
    'seed': ({}, dict(seed=1)),
    'num_clients': ({}, dict(num_clients=30)),
    'partition': ({}, dict(partition='shards')),
    'partition_alpha': (dict(partition='dirichlet', partition_alpha=0.5),
                        dict(partition='dirichlet', partition_alpha=5.0)),
    'validation_fraction': ({}, dict(validation_fraction=0.1)),
    'eval_split': (dict(validation_fraction=0.1),
                   dict(validation_fraction=0.1, eval_split='validation')),
    'cache_dir': ({}, dict(cache_dir='/tmp/elsewhere')),
    'max_concurrent_clients': ({}, dict(max_concurrent_clients=1)),
}
# The tiny run the graph checks trace: the digits task, 20 clients.
_SMALL = dict(clients_per_round=4, num_clients=20)


def _config(**overrides):
  from tff_clip.program.config import TrainConfig
  return TrainConfig(**{**_SMALL, **overrides})


def _cache_key(config, noise_multiplier=0.5, task=None, exact=False):
  from scripts import program
  from tff_clip.program import assembly
  return process_cache.graph_cache_key(config, program.build_task,
                                   noise_multiplier, task, exact)


def test_every_data_only_field_has_its_graph_check():
  from tff_clip.program import assembly
  assert set(_DATA_ONLY_PAIRS) == set(process_cache.DATA_ONLY)


def test_the_key_of_a_default_run_is_unchanged_by_seed(cache_dir):
  from tff_clip.program.config import TrainConfig
  assert _cache_key(TrainConfig(seed=1)) == _cache_key(TrainConfig())


# Each hyperparameter (`hyperparameters.HYPERPARAMETERS`): a configuration
# that differs from `_config()` in it alone.
_HYPERPARAMETER_CHANGES = {
    'target_epsilon': dict(target_epsilon=4.0, noise_multiplier=None),
    'delta': dict(delta=1e-4),
    'noise_multiplier': dict(noise_multiplier=1.0),
    'clip_norm': dict(bounding='clip', clip_norm=0.3),
    'target_quantile': dict(target_quantile=0.7),
    'initial_clip_norm': dict(initial_clip_norm=0.5),
    'clip_learning_rate': dict(clip_learning_rate=0.1),
    'server_learning_rate': dict(server_learning_rate=0.5),
    'server_momentum': dict(server_momentum=0.5),
}


# Where a change keeps a hyperparameter's kind (`hyperparameters.shape`): a
# fixed clip norm to another, a given target quantile to another.
_HYPERPARAMETER_BASES = {'clip_norm': dict(clip_norm=1.0),
                         'target_quantile': dict(target_quantile=0.5)}


def test_every_hyperparameter_has_its_key_check():
  from tff_clip.program import hyperparameters
  assert set(_HYPERPARAMETER_CHANGES) == set(hyperparameters.HYPERPARAMETERS)


@pytest.mark.parametrize('field', sorted(_HYPERPARAMETER_CHANGES))
def test_a_hyperparameter_leaves_the_shape_key_alone_not_the_exact_key(
    cache_dir, field):
  changes = _HYPERPARAMETER_CHANGES[field]
  kind = _HYPERPARAMETER_BASES.get(field, {})
  base = _config(bounding=changes.get('bounding', 'normalize'), **kind)
  config = _config(**dict(dict(bounding='normalize', **kind), **changes))
  noise = 0.7 if field in ('target_epsilon', 'delta', 'noise_multiplier') else 0.5
  assert _cache_key(config, noise) == _cache_key(base)
  assert (_cache_key(config, noise, exact=True) !=
          _cache_key(base, exact=True))


@pytest.mark.parametrize('kinds', [
    (dict(clip_norm=1.0), dict(clip_norm='adaptive')),
    (dict(target_quantile=0.5), dict(target_quantile=None)),
], ids=['clip_norm', 'target_quantile'])
def test_a_hyperparameter_of_another_kind_has_its_own_shape_key(cache_dir,
                                                               kinds):
  # A fixed and an adaptive clip norm build other aggregators (so do a given
  # target quantile and one that follows the noise, which may switch): one
  # grid's cells must not try, and fail, to run on the other's graphs.
  fixed, adaptive = (_config(bounding='clip', **kind) for kind in kinds)
  assert _cache_key(fixed) != _cache_key(adaptive)


# A grid's cells share an aggregator or a server optimizer built once in a
# process only where the parts that build them are equal field by field
# (`hyperparameters._structure`): every hyperparameter tells them apart.
@pytest.mark.parametrize('field', sorted(_HYPERPARAMETER_CHANGES))
def test_a_hyperparameter_tells_the_server_parts_apart(field):
  from tff_clip.program import assembly
  from tff_clip.program import hyperparameters
  changes = _HYPERPARAMETER_CHANGES[field]
  noise = {'target_epsilon': 0.7, 'delta': 0.7, 'noise_multiplier': 0.7}
  # With momentum, which the server optimizer reads (plain SGD has none).
  base = _config(bounding=changes.get('bounding', 'normalize'),
                 server_optimizer='sgdm')
  config = _config(**dict(dict(bounding='normalize', server_optimizer='sgdm'),
                          **changes))
  describe = lambda c, z: hyperparameters._structure(
      assembly.server_parts(c, z))
  assert describe(base, 0.5) == describe(base, 0.5)  # Built again: equal.
  assert describe(config, noise.get(field, 0.5)) != describe(base, 0.5)


def test_a_description_tells_every_bit_apart_and_refuses_what_it_cannot_see():
  import tensorflow as tf
  from tff_clip.program import hyperparameters
  describe = hyperparameters._structure
  assert describe((1.0, 'a', None)) == describe((1.0, 'a', None))
  for a, b in ((0.0, -0.0), (1.0, np.nextafter(1.0, 2.0)), (1, 1.0),
               (True, 1), ((1,), [1]), (np.float32(1), np.float64(1)),
               (np.zeros(2), np.zeros(3))):
    assert describe(a) != describe(b), (a, b)
  # A function made twice by the same code: its closure tells it apart.
  scaled = lambda scale: (lambda x: x * scale)
  assert describe(scaled(2.0)) == describe(scaled(2.0))
  assert describe(scaled(2.0)) != describe(scaled(3.0))
  assert describe(scaled(2.0)) != describe(lambda x: x * 2.0)
  for unseen in (tf.Variable(1.0), object(),
                 dataclasses.make_dataclass('Slotted', ['a'], slots=True)(1)):
    with pytest.raises(hyperparameters._Unkeyable):
      describe({'part': unseen})


_CORRELATED = {
    'banded': dict(sampling='min_separation', noise_mechanism='banded',
                   bands=4),
    'tree': dict(sampling='min_separation', noise_mechanism='tree', bands=4),
    'blt': dict(sampling='min_separation', noise_mechanism='blt', bands=4),
}


@pytest.mark.parametrize('mechanism', sorted(_CORRELATED))
def test_a_correlated_mechanisms_rounds_stay_in_the_key(cache_dir, mechanism):
  # BLT's factorization is computed for the run's rounds (its graphs and
  # state differ with them: the slow test below).
  noise = _CORRELATED[mechanism]
  assert (_cache_key(_config(**noise, rounds=20)) !=
          _cache_key(_config(**noise, rounds=40)))


def test_independent_noise_shares_one_entry_across_rounds(cache_dir):
  assert _cache_key(_config(rounds=20)) == _cache_key(_config(rounds=40))


@pytest.mark.slow
@pytest.mark.parametrize('mechanism', ['independent'] + sorted(_CORRELATED))
def test_where_the_aggregator_depends_on_the_rounds_so_does_the_key(
    cache_dir, mechanism):
  # The oracle: the mechanism's own aggregator, built for 20 and 40 rounds
  # (its `next` graphs in canonical form, its initial state).
  import tensorflow_federated as tff
  from scripts import program
  from tff_clip.program import assembly, hyperparameters
  noise = _CORRELATED.get(mechanism, {})
  configs = [_config(**noise, rounds=rounds) for rounds in (20, 40)]
  task = program.build_task(configs[0])
  weights_type = tff.tensorflow.computation(
      lambda: tff.learning.models.ModelWeights.from_model(task.model_fn())
  ).type_signature.result
  built = [hyperparameters._Components(c, 1.0, assembly.server_parts,
                                       weights_type) for c in configs]
  states = [[np.asarray(leaf) for leaf in b.initializers['aggregator']()]
            for b in built]
  def same_state(a, b):  # Noise keys (int64[2]) are drawn afresh.
    return len(a) == len(b) and all(
        x.shape == y.shape and (x.dtype == np.int64 and x.shape == (2,) or
                                np.array_equal(x, y)) for x, y in zip(a, b))
  depends = (built[0].digests != built[1].digests or
             not same_state(*states))
  if depends:
    assert _cache_key(configs[0]) != _cache_key(configs[1])
  assert depends == (mechanism == 'blt')  # What the docstring says.


def test_a_private_and_a_non_private_run_have_other_keys(cache_dir):
  # A private run weighs its clients uniformly: another client work.
  assert _cache_key(_config(), None) != _cache_key(_config(), 0.5)


def test_blurs_clip_norm_stays_in_the_key(cache_dir):
  # BLUR's clip norm defaults to --clip_norm, and BLUR runs on the clients.
  blur = dict(bounding='clip', blur_strength=0.5, noise_multiplier=None)
  assert (_cache_key(_config(**blur, clip_norm=0.3), None) !=
          _cache_key(_config(**blur, clip_norm=1.0), None))


@pytest.mark.parametrize('field', sorted(_DATA_ONLY_PAIRS))
def test_a_data_only_field_leaves_the_key_alone(cache_dir, field):
  first, second = _DATA_ONLY_PAIRS[field]
  assert _cache_key(_config(**first)) == _cache_key(_config(**second))


@pytest.mark.parametrize('overrides', [
    dict(bounding='clip'), dict(noise_mechanism='banded'),
    dict(clients_per_round=5), dict(client_learning_rate=0.05),
    dict(server_optimizer='adam'), dict(local_steps=2), dict(batch_size=8),
    dict(task='emnist_logreg'),
], ids=lambda overrides: next(iter(overrides)))
def test_a_field_that_shapes_the_graph_changes_the_key(cache_dir, overrides):
  assert _cache_key(_config(**overrides)) != _cache_key(_config())


def test_the_key_changes_with_the_clients_element_spec(cache_dir):
  import types
  import tensorflow as tf
  def task(shape):
    return types.SimpleNamespace(datasets=types.SimpleNamespace(
        element_type_structure=tf.TensorSpec(shape, tf.float32)))
  assert (_cache_key(_config(), task=task([None, 8])) !=
          _cache_key(_config(), task=task([None, 9])))


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


def _batched_round(session, state, round_num=1):
  """One round with the cohort's batches (`ClientDatasets.datasets`): the
  batched client path where the session took it. Its output."""
  cohort = session.sampler.sample(round_num)
  return session.process.next(
      state, session.client_datasets.datasets(cohort, round_num))


def _assert_same_rounds(oracle, session):
  """Two rounds of each from `oracle`'s initial state (one noise key for
  both) end bit for bit alike: weights, metrics, evaluation. Their states."""
  state = oracle.initial_state()
  expected = _rounds(oracle, state)
  actual = _rounds(session, state)
  for a, b in zip(expected[0], actual[0], strict=True):
    np.testing.assert_array_equal(a, b)
  assert repr(expected[1]) == repr(actual[1])
  assert repr(expected[2]) == repr(actual[2])
  return expected[3], actual[3]


def _forget_loaded_runners():
  """No runner loaded in this process: the next session reads the disk."""
  from tff_clip.runtime import runner_cache
  runner_cache.forget()


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  """A cold session (which fills the cache), then one from the cache."""
  from scripts import program
  from tff_clip.program import assembly
  from tff_clip.program.config import TrainConfig
  directory = tmp_path_factory.mktemp('graph_cache')
  monkeypatch = pytest.MonkeyPatch()
  monkeypatch.setenv(graph_cache.ENV, str(directory))
  # A given target quantile: `_OTHER_HYPERPARAMETERS` gives another value
  # of it (a quantile that follows the noise is another graph shape).
  config = TrainConfig(clients_per_round=4, num_clients=20,
                       target_quantile=0.5)
  traced = []
  original = assembly.build_process
  monkeypatch.setattr(assembly, 'build_process',
                      lambda *a, **k: traced.append(1) or original(*a, **k))
  _forget_loaded_runners()
  cold = assembly.Session(config, program.build_task)
  entries = sorted(directory.glob('*.graphs'))
  _forget_loaded_runners()  # The warm one from the disk entry.
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
  cold_state, warm_state = _assert_same_rounds(cold, warm)
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
  _forget_loaded_runners()
  rebuilt = assembly.Session(built['config'], program.build_task)
  assert len(built['traced']) == before + 1
  assert path.read_bytes() != bytes(data)
  state = built['cold'].initial_state()
  for a, b in zip(_rounds(built['cold'], state, 1)[0],
                  _rounds(rebuilt, state, 1)[0], strict=True):
    np.testing.assert_array_equal(a, b)
  _forget_loaded_runners()
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
  # Nothing traced in the second process (neither the process nor the
  # batched cohort call): not even the aggregator's modules are imported
  # when its state's containers are looked up.
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
  # The process's graphs, and the batched round's traced cohort call.
  written = {entry: os.stat(entry).st_ino
             for entry in directory.glob('*.graphs')}
  assert len(written) == 2
  warm = train('warm')
  assert 'Graph cache' not in warm.stderr
  assert {entry: os.stat(entry).st_ino  # Neither traced and rewritten.
          for entry in directory.glob('*.graphs')} == written


_TRACE = r"""
import pickle, re, sys
import tensorflow as tf
from scripts import program
from tff_clip.program import assembly
from tff_clip.program.config import TrainConfig
from tff_clip.runtime import simulation
tf.keras.utils.set_random_seed(0)
session = assembly.Session(TrainConfig(**eval(sys.argv[1])), program.build_task)
graphs = dict(session.process.graphs)
for name, computation in simulation.parse_graphs(graphs).items():
  if computation.WhichOneof('computation') != 'tensorflow':
    continue
  graph_def = tf.compat.v1.GraphDef()
  computation.tensorflow.graph_def.Unpack(graph_def)
  computation.tensorflow.ClearField('graph_def')
  text = str(computation) + str(graph_def)
  names = {}
  graphs[name] = re.sub(
      r'\b[A-Za-z_]\w*?_\d+\b',
      lambda m: names.setdefault(m.group(0), f'name{len(names)}'), text)
with open(sys.argv[2], 'wb') as f:
  pickle.dump(graphs, f)
"""
_traced = {}


def _traced_graphs(tmp_path_factory, **overrides):
  """{name: graph} of TFF's process for `_config(**overrides)`, traced afresh
  (cache off) in a fresh interpreter: the serialized bytes, a TensorFlow
  graph as its `GraphDef`'s text with its numbered names (`while_body_12`,
  `__inference_client_update_910`) renamed in order of appearance.

  TensorFlow names a traced function with a process-wide counter (which,
  e.g., building a validation set moves on), and TFF draws the variables'
  initial values (replaced by `initial_model_weights`) when it traces: one
  fresh interpreter per trace, TensorFlow's global seed fixed, and the
  numbered names renamed make two traces of one configuration equal.
  """
  import pathlib
  import pickle
  import subprocess
  import sys
  fields = {**_SMALL, **overrides}
  key = repr(sorted(fields.items()))
  if key not in _traced:
    path = tmp_path_factory.mktemp('traced') / 'graphs.pickle'
    subprocess.run(
        [sys.executable, '-c', _TRACE, repr(fields), str(path)],
        cwd=pathlib.Path(__file__).parent.parent, check=True,
        env=dict(os.environ, **{graph_cache.ENV: 'off'}))
    _traced[key] = pickle.loads(path.read_bytes())
  return _traced[key]


@pytest.mark.slow
@pytest.mark.parametrize('field', sorted(_DATA_ONLY_PAIRS))
def test_configs_differing_only_in_a_data_only_field_trace_the_same_graphs(
    tmp_path_factory, field):
  first, second = _DATA_ONLY_PAIRS[field]
  first = _traced_graphs(tmp_path_factory, **first)
  second = _traced_graphs(tmp_path_factory, **second)
  assert sorted(first) == sorted(second)
  for name in first:
    assert first[name] == second[name], name


@pytest.mark.slow
def test_a_graph_shaping_field_traces_other_graphs(tmp_path_factory):
  # The check above can tell graphs apart: a noise level is in them.
  assert (_traced_graphs(tmp_path_factory) !=
          _traced_graphs(tmp_path_factory, noise_multiplier=0.7))


@pytest.fixture(scope='module')
def traced_seed_1(built):
  """The seed-1 session traced afresh, the cache off: the oracle of a run
  that takes its graphs from elsewhere."""
  from scripts import program
  from tff_clip.program import assembly
  before = len(built['traced'])
  built['monkeypatch'].setenv(graph_cache.ENV, 'off')
  try:
    traced = assembly.Session(dataclasses.replace(built['config'], seed=1),
                              program.build_task)
  finally:
    built['monkeypatch'].setenv(graph_cache.ENV, str(built['directory']))
  assert len(built['traced']) == before + 1
  return traced


@pytest.mark.slow
def test_a_seed_1_run_from_a_seed_0_entry_runs_as_a_traced_seed_1_run(
    built, traced_seed_1):
  from scripts import program
  from tff_clip.program import assembly
  config = dataclasses.replace(built['config'], seed=1)
  before = len(built['traced'])
  _forget_loaded_runners()
  served = assembly.Session(config, program.build_task)
  assert len(built['traced']) == before  # From the seed-0 run's entry.
  _assert_same_rounds(traced_seed_1, served)


# ----------------------------------------------------------------------------
# One loaded runner per graph shape in a process: a sweep's or the frontier's
# next seed in the same worker imports nothing.


@pytest.fixture
def loads(monkeypatch):
  """The disk's loads (`runner_cache._load`) stubbed and counted, with no
  runner loaded yet: each load gives a new runner."""
  from tff_clip.runtime import runner_cache
  monkeypatch.setattr(runner_cache, '_loaded', collections.OrderedDict())
  calls = []
  monkeypatch.setattr(runner_cache, '_load',
                      lambda key, threads: calls.append(key) or object())
  return calls


def _runner(key, client_threads=None):
  from tff_clip.runtime import runner_cache
  return runner_cache.runner(key, client_threads)


def test_a_runner_loaded_in_this_process_serves_its_key_again(loads):
  first = _runner('a')
  assert _runner('a') is first
  assert loads == ['a']


def test_another_key_or_thread_count_loads_its_own_runner(loads):
  runners = [_runner('a'), _runner('b'), _runner('a', client_threads=1)]
  assert len({id(r) for r in runners}) == 3
  assert loads == ['a', 'b', 'a']


def test_no_runner_is_kept_where_the_disk_cache_is_not_used(loads):
  # The key is None for a fixed --noise_seed, an audited run, TFF's
  # workers, or the cache switched off (`process_cache.graph_cache_key`).
  from tff_clip.runtime import runner_cache
  assert _runner(None) is None
  assert loads == [] and not runner_cache._loaded


def test_the_least_recently_used_runner_is_dropped_past_the_bound(loads):
  from tff_clip.runtime import runner_cache
  keys = [f'k{i}' for i in range(runner_cache._KEPT)]
  runners = {key: _runner(key) for key in keys}
  assert _runner(keys[0]) is runners[keys[0]]  # Now the most recent.
  _runner('new')
  assert len(runner_cache._loaded) == runner_cache._KEPT
  assert _runner(keys[0]) is runners[keys[0]]
  assert _runner(keys[1]) is not runners[keys[1]]  # Dropped: loaded again.
  assert loads == keys + ['new', keys[1]]


def test_a_missing_entry_keeps_nothing(monkeypatch):
  from tff_clip.runtime import runner_cache
  monkeypatch.setattr(runner_cache, '_loaded', collections.OrderedDict())
  monkeypatch.setattr(runner_cache, '_load', lambda key, threads: None)
  assert _runner('a') is None and not runner_cache._loaded


def test_a_traced_runner_is_kept_only_where_a_disk_entry_may_hold_it(
    cache_dir, monkeypatch):
  from tff_clip.runtime import runner_cache, simulation
  monkeypatch.setattr(runner_cache, '_loaded', collections.OrderedDict())
  runner = simulation.InProcessRunner.__new__(simulation.InProcessRunner)
  runner.graphs = {'containers': b'{}'}
  monkeypatch.setattr(simulation, 'parse_graphs', lambda graphs: {})
  monkeypatch.setattr(graph_cache, 'has_baked_seed', lambda graphs: True)
  runner_cache.store('a', None, runner)
  assert not runner_cache._loaded and not list(cache_dir.glob('*'))
  monkeypatch.setattr(graph_cache, 'has_baked_seed', lambda graphs: False)
  runner_cache.store('a', None, runner)
  assert runner_cache.runner('a', None) is runner


def _model(session, state) -> list:
  return [np.asarray(x) for x in
          session.process.get_model_weights(state).trainable]


def _loaded_runner(session):
  """The runner a session got from the cache: its process, or the runner
  the batched client path wraps (`--client_execution=auto`)."""
  return getattr(session.process, 'runner', session.process)


@pytest.mark.slow
def test_a_later_seed_reuses_the_loaded_runner_and_runs_as_a_fresh_trace(
    built, traced_seed_1, monkeypatch):
  from scripts import program
  from tff_clip.program import assembly
  loads = []  # Disk reads.
  load = graph_cache.load
  monkeypatch.setattr(graph_cache, 'load',
                      lambda key: loads.append(key) or load(key))
  _forget_loaded_runners()
  before = len(built['traced'])
  first = assembly.Session(built['config'], program.build_task)
  _rounds(first, first.initial_state())  # The seed-0 run goes first.
  second = assembly.Session(dataclasses.replace(built['config'], seed=1),
                            program.build_task)
  assert len(loads) == 1 and len(built['traced']) == before
  assert _loaded_runner(second) is _loaded_runner(first)
  # Its own initial model, then its rounds, as the fresh trace's (one noise
  # key for both: the oracle's).
  for a, b in zip(_model(traced_seed_1, traced_seed_1.initial_state()),
                  _model(second, second.initial_state()), strict=True):
    np.testing.assert_array_equal(a, b)
  _assert_same_rounds(traced_seed_1, second)


@pytest.mark.slow
def test_runs_on_one_loaded_runner_draw_fresh_noise_keys(built):
  from scripts import program
  from tff_clip.program import assembly
  _forget_loaded_runners()
  one = assembly.Session(built['config'], program.build_task)
  other = assembly.Session(built['config'], program.build_task)
  assert _loaded_runner(other) is _loaded_runner(one)
  states = [one.initial_state(), other.initial_state(), one.initial_state()]
  keys = [tuple(_noise_key(state.aggregator)) for state in states]
  assert len(set(keys)) == 3
  # Same model, same cohort, same data: only the noise tells them apart.
  for a, b in zip(_model(one, states[0]), _model(other, states[1]),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  after = [_rounds(session, state, 1)[3] for session, state in
           ((one, states[0]), (other, states[1]))]
  assert any(not np.array_equal(a, b) for a, b in
             zip(_model(one, after[0]), _model(other, after[1])))


@pytest.mark.slow
def test_a_stale_entry_is_rebuilt_while_another_keys_runner_is_loaded(built):
  from scripts import program
  from tff_clip.program import assembly
  _forget_loaded_runners()
  loaded = assembly.Session(built['config'], program.build_task)
  config = dataclasses.replace(built['config'], client_learning_rate=0.05)
  key = process_cache.graph_cache_key(config, program.build_task,
                                  config.noise_multiplier,
                                  program.build_task(config))
  (entry,) = built['entries']  # The loaded runner's.
  stale = built['directory'] / f'{key}.graphs'
  stale.write_bytes(entry.read_bytes())  # Another key's graphs.
  before = len(built['traced'])
  rebuilt = assembly.Session(config, program.build_task)
  assert len(built['traced']) == before + 1
  assert _loaded_runner(rebuilt) is not _loaded_runner(loaded)
  assert graph_cache.load(key) is not None  # Replaced by its own graphs.



# ----------------------------------------------------------------------------
# One traced process for every value of the hyperparameters
# (`tff_clip.program.hyperparameters`): another noise multiplier, server
# learning rate and target quantile take the entry's graphs with a state of
# their own, and run as their own trace would.

# The `built` entry's configuration with other hyperparameters.
_OTHER_HYPERPARAMETERS = dict(noise_multiplier=2.0, server_learning_rate=0.3,
                              server_momentum=0.5, target_quantile=0.1,
                              initial_clip_norm=0.2)


@pytest.fixture(scope='module')
def rebased(built):
  """(the other hyperparameters' session from the `built` entry, the same
  configuration traced afresh with the cache off)."""
  from scripts import program
  from tff_clip.program import assembly
  config = dataclasses.replace(built['config'], **_OTHER_HYPERPARAMETERS)
  before = len(built['traced'])
  _forget_loaded_runners()
  served = assembly.Session(config, program.build_task)
  assert len(built['traced']) == before  # From the entry: nothing traced.
  built['monkeypatch'].setenv(graph_cache.ENV, 'off')
  try:
    traced = assembly.Session(config, program.build_task)
  finally:
    built['monkeypatch'].setenv(graph_cache.ENV, str(built['directory']))
  assert len(built['traced']) == before + 1
  return served, traced


def _without_noise_keys(session, state) -> list:
  """The state's leaves, the noise keys (int64[2]) left out."""
  return [leaf for leaf in _leaves(session, state)
          if not (leaf.dtype == np.int64 and leaf.shape == (2,))]


@pytest.mark.slow
def test_other_hyperparameters_start_from_their_own_traces_state(rebased):
  from tff_clip.program import hyperparameters
  served, traced = rebased
  assert isinstance(_loaded_runner(served), hyperparameters.Rebased)
  expected = _without_noise_keys(traced, traced.initial_state())
  actual = _without_noise_keys(served, served.initial_state())
  assert len(expected) == len(actual) > 0
  for a, b in zip(expected, actual):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_other_hyperparameters_run_bit_for_bit_as_their_own_trace(rebased):
  served, traced = rebased
  # One noise key for both (the oracle's): the noise, at the run's own
  # multiplier, is the same draw, and so is everything else.
  traced_state, served_state = _assert_same_rounds(traced, served)
  event = served.round_event(served_state, 2)
  assert event == traced.round_event(traced_state, 2)
  # The value and count releases of adaptive clipping compose to the run's
  # multiplier, 2.0 (sum of z_i^-2 = z^-2), not the traced entry's 0.5.
  releases = event.event.events
  assert len(releases) == 2
  assert sum(e.noise_multiplier**-2 for e in releases) == pytest.approx(
      2.0**-2, rel=1e-6)


@pytest.mark.slow
def test_a_rebased_run_trains_its_cohort_in_the_call_its_graph_shape_traced(
    built, rebased):
  # The grid's other cells take the batched client path too, in the cohort
  # call traced for the graph shape's entry: its aggregator's graphs were
  # compared with theirs when they were rebased onto it, so the call holds
  # the same query graph, its values read from the state. Its round is the
  # round of a process traced for the cell's own values, bit for bit.
  from tff_clip.runtime import batched_clients
  served, traced = rebased
  assert served.client_execution == traced.client_execution == 'batched'
  assert isinstance(served.process, batched_clients.BatchedRunner)
  state = served.initial_state()
  own = _batched_round(traced, state)
  for a, b in zip(_leaves(served, _batched_round(served, state).state),
                  _leaves(traced, own.state), strict=True):
    np.testing.assert_array_equal(a, b)
  _batched_round(built['warm'], built['warm'].initial_state())
  assert served.trace_key == built['warm'].trace_key == served.model_key
  assert served.process._round is built['warm'].process._round
  # Traced afresh (the cache off), the cell's own process keeps its own.
  assert traced.trace_key is None


@pytest.mark.slow
def test_a_later_seed_takes_the_cohort_call_traced_by_the_first(built):
  # A seed is data, not graph (`process_cache.DATA_ONLY`): the sessions of
  # one cell's seeds share one trace of the cohort call, and each is its own
  # trace's run (the bit-for-bit test above compares them).
  from scripts import program
  from tff_clip.program import assembly
  first = assembly.Session(dataclasses.replace(built['config'], seed=5),
                           program.build_task)
  second = assembly.Session(dataclasses.replace(built['config'], seed=6),
                            program.build_task)
  for session in (first, second):
    _batched_round(session, session.initial_state())
  assert first.process._round is second.process._round


@pytest.mark.slow
def test_a_rebased_run_draws_a_fresh_noise_key_on_every_start(built, rebased):
  served, _ = rebased
  states = [served.initial_state(), served.initial_state(),
            built['warm'].initial_state()]
  keys = [tuple(_noise_key(state.aggregator)) for state in states]
  assert len(set(keys)) == 3


@pytest.mark.slow
def test_a_cells_later_seed_takes_its_rebased_runner_without_a_rebuild(
    built, rebased, monkeypatch):
  # The grid's cell with other hyperparameters, seed after seed: the check
  # that their values are state, not graph (building and comparing the
  # aggregator and server optimizer), runs once per cell in a process; every
  # seed still starts from a noise key of its own.
  from scripts import program
  from tff_clip.program import assembly
  from tff_clip.program import hyperparameters
  served, _ = rebased
  builds = []
  components = hyperparameters._Components
  monkeypatch.setattr(hyperparameters, '_Components',
                      lambda *args: builds.append(args) or components(*args))
  later = assembly.Session(
      dataclasses.replace(built['config'], seed=7, **_OTHER_HYPERPARAMETERS),
      program.build_task)
  assert not builds
  assert _loaded_runner(later) is _loaded_runner(served)
  keys = {tuple(_noise_key(s.initial_state().aggregator))
          for s in (served, later, later)}
  assert len(keys) == 3
  # Other values again: checked anew, not served another cell's state.
  other = assembly.Session(
      dataclasses.replace(built['config'], seed=7, **dict(
          _OTHER_HYPERPARAMETERS, server_learning_rate=0.2)),
      program.build_task)
  assert builds
  assert _loaded_runner(other) is not _loaded_runner(served)


@pytest.mark.slow
def test_cells_sharing_an_aggregator_build_it_once_and_draw_their_own_keys(
    built, rebased, monkeypatch):
  # The grid's cells at other learning rates share the aggregator of the
  # cell rebased above (equal field by field): the check of its graphs is
  # not built again, only each cell's own server optimizer. Each session
  # still starts from a noise key of its own and its own learning rate.
  from scripts import program
  from tff_clip.learning import algorithms
  from tff_clip.program import assembly
  built_parts = []
  for name in ('server_aggregator', 'server_finalizer'):
    original = getattr(algorithms, name)
    monkeypatch.setattr(
        algorithms, name,
        lambda *a, _original=original, _name=name: (
            built_parts.append(_name) or _original(*a)))
  served, _ = rebased
  cells = [assembly.Session(dataclasses.replace(
      built['config'], seed=9,
      **dict(_OTHER_HYPERPARAMETERS, server_learning_rate=rate)),
                            program.build_task) for rate in (0.41, 0.42)]
  assert built_parts == ['server_finalizer', 'server_finalizer']
  states = [cell.initial_state() for cell in cells + [served]]
  assert len({tuple(_noise_key(state.aggregator)) for state in states}) == 3
  for state, rate in zip(states, (0.41, 0.42, 0.3)):
    rates = [leaf for leaf in tf_nest_leaves(state.finalizer)
             if np.ndim(leaf) == 0 and np.isclose(leaf, rate)]
    assert rates, (rate, state.finalizer)
  # The aggregator's state, the noise key aside, is the shared one's.
  for a, b in zip(tf_nest_leaves(states[0].aggregator),
                  tf_nest_leaves(states[2].aggregator), strict=True):
    if not (a.dtype == np.int64 and a.shape == (2,)):
      np.testing.assert_array_equal(a, b)


def tf_nest_leaves(value) -> list:
  import tensorflow as tf
  return [np.asarray(leaf) for leaf in tf.nest.flatten(value)]


@pytest.mark.slow
def test_the_cells_of_a_grid_share_the_servers_traced_evaluation(
    built, rebased, monkeypatch):
  # The evaluation is of the model alone, which no server hyperparameter
  # shapes: a grid's cells take one trace of it.
  from tff_clip.learning import evaluation
  served, _ = rebased
  warm = built['warm']
  assert served.model_key == warm.model_key is not None
  asked = []
  monkeypatch.setattr(evaluation, 'server_evaluation',
                      lambda model_fn, key=None: asked.append(key))
  served.__dict__.pop('_evaluation', None)  # Made afresh: asks by its key.
  try:
    served._evaluation  # pylint: disable=pointless-statement
  finally:
    served.__dict__.pop('_evaluation', None)
  assert asked == [warm.model_key]


@pytest.mark.slow
def test_a_value_that_is_a_constant_of_a_graph_gets_its_own_trace(built):
  # Without DP a fixed clip norm is a constant of the aggregator's graph:
  # the entry of norm 0.1 must not serve norm 0.3.
  from scripts import program
  from tff_clip.program import assembly
  from tff_clip.program import hyperparameters
  config = dataclasses.replace(built['config'], noise_multiplier=None,
                               bounding='clip', clip_norm=0.1)
  other = dataclasses.replace(config, clip_norm=0.3)
  before = len(built['traced'])
  first = assembly.Session(config, program.build_task)
  second = assembly.Session(other, program.build_task)
  assert len(built['traced']) == before + 2
  assert not isinstance(_loaded_runner(second), hyperparameters.Rebased)
  # Nor does it share the batched cohort call norm 0.1's trace is kept under.
  assert second.trace_key not in (None, first.trace_key)
  # Stored under the exact key: a later run of norm 0.3 traces nothing.
  _forget_loaded_runners()
  assembly.Session(other, program.build_task)
  assert len(built['traced']) == before + 2
  del first


@pytest.mark.slow
def test_a_noise_level_that_changes_the_default_bounding_gets_its_own_trace(
    built):
  # The entry's default run normalizes (z sqrt(d) / n = 0.5 x 49.1 / 4 =
  # 6.1); at z = 0.05 (r = 0.61) the default clips: another graph, which the
  # rebase check must find and trace, not serve the entry's normalization.
  from scripts import program
  from tff_clip.program import assembly
  from tff_clip.program import hyperparameters
  assert built['warm'].bounding == 'normalize'
  config = dataclasses.replace(built['config'], noise_multiplier=0.05)
  before = len(built['traced'])
  _forget_loaded_runners()
  clipping = assembly.Session(config, program.build_task)
  assert clipping.bounding == 'clip'
  assert len(built['traced']) == before + 1
  assert not isinstance(_loaded_runner(clipping), hyperparameters.Rebased)


# ----------------------------------------------------------------------------
# The key covers the code beside the builder: an edited model is a new graph.

_BUILDER = '''
import types
import edited_model
import tiny_model


def build(config):
  return types.SimpleNamespace(
      name='edited', model_fn=edited_model.model_fn,
      datasets=types.SimpleNamespace(
          element_type_structure=tiny_model.INPUT_SPEC))
'''

_MODEL = '''
import tensorflow as tf
import tensorflow_federated as tff
import tiny_model


def model_fn():
  keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
      2, input_shape=(3,), activation={activation!r})])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(),
      input_spec=tiny_model.INPUT_SPEC)
'''


def _builder_beside(directory, activation):
  """`edited_builder.build` of `directory`, whose byte-identical builder
  imports a model module with `activation`."""
  import importlib  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  directory.mkdir()
  (directory / 'edited_builder.py').write_text(_BUILDER)
  (directory / 'edited_model.py').write_text(_MODEL.format(
      activation=activation))
  for name in ('edited_builder', 'edited_model'):
    sys.modules.pop(name, None)
  sys.path.insert(0, str(directory))
  try:
    return importlib.import_module('edited_builder').build
  finally:
    sys.path.remove(str(directory))


def test_a_model_edited_beside_the_builder_is_another_entry(tmp_path,
                                                             monkeypatch):
  """Two builder files alike byte for byte, importing model modules that
  differ in one activation (an edited tasks/models.py): two keys. Oracle:
  TFF's canonical digests of the two processes' `next` differ."""
  import sys  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip.learning import algorithms  # pylint: disable=g-import-not-at-top
  from tff_clip.program.config import TrainConfig  # pylint: disable=g-import-not-at-top
  from tff_clip.runtime import graph_defs  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(graph_cache.ENV, str(tmp_path / 'cache'))
  config = TrainConfig(clients_per_round=3, num_clients=20)
  sgd = tff.learning.optimizers.build_sgdm
  keys, digests = [], []
  try:
    for version, activation in (('v1', 'linear'), ('v2', 'relu')):
      build = _builder_beside(tmp_path / version, activation)
      task = build(config)
      keys.append(process_cache.graph_cache_key(config, build, 1.0, task))
      digests.append(graph_defs.canonical_digest(algorithms.build_fedavg(
          task.model_fn, client_optimizer=sgd(0.1),
          server_optimizer=sgd(1.0)).next))
  finally:
    for name in ('edited_builder', 'edited_model'):
      sys.modules.pop(name, None)
  assert digests[0] != digests[1]  # The graphs differ ...
  assert None not in keys and keys[0] != keys[1]  # ... so do the entries.
