"""Specification of the training program (`scripts.train`, `tff_clip.program.training`)."""

import collections
import csv
import dataclasses
import functools
import json
import re
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest

from scripts import program
from tff_clip import names
from tff_clip.program import assembly
from tff_clip.program import preflight
from tff_clip.program import program_logic
from tff_clip.program import release_managers
from tff_clip.program import run_directory
from tff_clip.program import training
from tff_clip.runtime import execution
import as_a_user  # pylint: disable=g-bad-import-order

# A small, fast run: 4 rounds of DP-FedAvg with adaptive clipping on digits,
# with reproducible noise so that runs can be compared.
SMALL = ['--rounds=4', '--clients_per_round=6', '--eval_every=2',
         '--progress=false', '--seed=3', '--noise_seed=11']


def _train(args, **popen_kwargs):
  return as_a_user.start(['-m', 'scripts.train', *args], **popen_kwargs)


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


# Exactly equal: what is a function of seeds and counts alone. Losses to
# 2e-3 relative and accuracies to 1.5 points: TF's CPU kernels in TFF's C++
# worker (and the merge of two workers' partial sums) add in a run-dependent
# order, and float sums are not associative. That moves a round's model by
# ~1e-7, its loss by ~1e-4, and can flip a test example on the boundary.
EXACT = ('round', 'clip_norm', 'epsilon')


def _assert_same_metrics(rows_a, rows_b):
  assert [r['round'] for r in rows_a] == [r['round'] for r in rows_b]
  for a, b in zip(rows_a, rows_b):
    for key in a:
      if key == 'seconds':
        continue
      tolerance = (dict(rtol=1e-12) if key in EXACT or key.startswith(
          'epsilon_') else
                   dict(rtol=0, atol=0.015) if 'accuracy' in key else
                   dict(rtol=2e-3))
      np.testing.assert_allclose(float(a[key]), float(b[key]),
                                 err_msg=f'round {a["round"]}, {key}',
                                 **tolerance)


# ----------------------------------------------------------------------------
# Bad input: refused before any training, naming the flag.


@pytest.mark.parametrize('changes, flag', [
    (dict(bounding='squash'), 'bounding'),
    (dict(bounding='none', noise_multiplier=1.0), 'bounding'),
    (dict(noise_multiplier=1.0, target_epsilon=3.0), 'target_epsilon'),
    (dict(noise_multiplier=-0.5), 'noise_multiplier'),
    (dict(clip_norm=0.0), 'clip_norm'),
    (dict(clip_norm='sometimes'), 'clip_norm'),
    (dict(delta=1.5), 'delta'),
    (dict(sampling='stratified'), 'sampling'),
    (dict(clients_per_round=0), 'clients_per_round'),
    (dict(rounds=0), 'rounds'),
    (dict(blur_strength=20.0, clip_norm=1.0), 'blur_strength'),
    (dict(lus_sparsity=1.0), 'lus_sparsity'),
    (dict(executor='remote'), 'workers'),
    (dict(executor='remote', workers=('nohost',)), 'workers'),
    (dict(executor='tpu'), 'executor'),
    (dict(checkpoint_every=0), 'checkpoint_every'),
    # A DP run checkpoints by round count, never by the clock.
    (dict(checkpoint_interval_s=5.0), 'checkpoint_interval_s'),
    # Checked in the dtype they are used in: float32 inf and 0 are refused.
    (dict(clip_norm=1e39), 'clip_norm.*overflows float32'),
    (dict(initial_clip_norm=1e39), 'initial_clip_norm'),
    (dict(noise_multiplier=1e39), 'noise_multiplier.*overflows'),
    (dict(noise_multiplier=1e-50), 'noise_multiplier.*underflows'),
    (dict(client_learning_rate=1e-50), 'client_learning_rate'),
    (dict(noise_seed=2**70), 'noise_seed'),
    (dict(noise_seed=True), 'noise_seed'),
    (dict(validation_fraction=1.0), 'validation_fraction'),
    (dict(eval_split='train'), 'eval_split'),
])
def test_bad_configuration_is_rejected_naming_the_flag(changes, flag):
  config = dataclasses.replace(training.TrainConfig(), **changes)
  with pytest.raises(training.ConfigError, match=flag):
    program.validate(config)


def test_a_partition_the_data_cannot_give_is_refused_naming_the_flag(
    tmp_path):
  """Known once the task's examples are read (1,438 digits for training):
  1,500 clients would leave some empty. The line names the flag, as every
  refusal does, and nothing is written."""
  config = training.TrainConfig(
      root_output_dir=str(tmp_path / 'runs'), partition='shards',
      num_clients=1500, rounds=1, noise_multiplier=None, progress=False)
  with pytest.raises(training.ConfigError, match=re.escape(
      '--num_clients (1500) is larger than the number of examples (1438)')):
    program.run(config)
  assert not (tmp_path / 'runs').exists()


BAD_FLAGS = [
    (['--bounding=none', '--noise_multiplier=1.0'], '--bounding'),
    (['--bounding=squash'], '--bounding'),
    (['--task=mnist'], '--task'),
    (['--partition=stripes'], '--partition'),
    (['--rounds=many'], '--rounds'),
    (['--clients_per_round=0'], '--clients_per_round'),
    (['--clip_norm=-0.0'], '--clip_norm'),
    (['--clipped_count_stddev=0'], '--clipped_count_stddev'),
    (['--target_quantile=0.5x'], '--target_quantile'),
    (['--sampling=uniform'], '--sampling'),
    (['--noise_seed=-1'], '--noise_seed'),
    (['--denominator=actual'], '--denominator'),
    (['--no_such_flag=1'], 'no_such_flag'),
    (['--clip_norm=1e39'], '--clip_norm'),
    (['--noise_multiplier=1e39'], '--noise_multiplier'),
    (['--noise_seed=1180591620717411303424'], '--noise_seed'),
]

@pytest.fixture(scope='module')
def cli_refusals(tmp_path_factory):
  """[(exit code, output, root_output_dir)] of each of BAD_FLAGS, refused
  in turn in one interpreter (`as_a_user.train_each`; the `python -m
  scripts.train` entry point's own refusals: tests/test_train_flags.py)."""
  roots = [tmp_path_factory.mktemp('refused') / 'runs' for _ in BAD_FLAGS]
  results = as_a_user.train_each([*args, f'--root_output_dir={root}']
                                 for (args, _), root in zip(BAD_FLAGS, roots))
  return [(code, stdout + stderr, root)
          for (code, stdout, stderr, _), root in zip(results, roots,
                                                     strict=True)]


@pytest.mark.parametrize('case', range(len(BAD_FLAGS)),
                         ids=[flag for _, flag in BAD_FLAGS])
def test_cli_bad_flag_is_one_line_exit_2_and_writes_nothing(cli_refusals,
                                                            case):
  code, output, root = cli_refusals[case]
  assert code == 2, output
  assert output.count('\n') == 1 and output.startswith('error: '), output
  assert BAD_FLAGS[case][1] in output
  assert not root.exists()


def test_evaluating_on_validation_data_nobody_held_out_is_refused(tmp_path):
  # Known once the task is built: checked in this process (the command
  # line's one-line exit 2 is the cases' above).
  config = training.TrainConfig(eval_split='validation',
                                root_output_dir=str(tmp_path / 'runs'))
  with pytest.raises(training.ConfigError,
                     match='^--eval_split=validation: .*--validation_fraction'):
    program.run(config)
  assert not (tmp_path / 'runs').exists()


def test_unreachable_target_epsilon_is_refused_before_any_write(tmp_path):
  # The task fixes its population: checked before anything is built (the
  # command line's refusal: tests/test_refusals.py).
  config = training.TrainConfig(noise_multiplier=None, target_epsilon=1e-6,
                                root_output_dir=str(tmp_path / 'runs'))
  with pytest.raises(training.ConfigError, match='^--target_epsilon: '):
    program.run(config)
  assert not (tmp_path / 'runs').exists()


def test_unreachable_worker_is_a_clear_error_before_its_timeout(tmp_path):
  port = portpicker.pick_unused_port()  # Nobody listens there.
  config = training.TrainConfig(
      root_output_dir=str(tmp_path), executor='remote',
      workers=(f'127.0.0.1:{port}',), worker_timeout_s=600.0)
  started = time.monotonic()
  try:
    with pytest.raises(training.ConfigError, match=f'127.0.0.1:{port}'):
      program.run(config)
  finally:
    execution.set_local_cpp_context()
  # Refused at once, not after the 600 s timeout: the connection attempt
  # takes at most 5 s (`execution.create_remote_async_context`); 30 s
  # leaves room for a loaded machine.
  assert time.monotonic() - started < 30.0
  assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------
# Kill -9 mid-run, rerun the same command: nothing lost, nothing recounted.


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  root = tmp_path_factory.mktemp('uninterrupted')
  proc = _train([*SMALL, f'--root_output_dir={root}',
                 '--experiment_name=run'])
  output, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, output
  return root / 'run', output


def test_default_outputs_are_written(uninterrupted):
  run_dir, output = uninterrupted
  for name in ('config.json', 'metrics.csv', 'ledger.json', 'plot.png',
               'summary.json'):
    assert (run_dir / name).exists(), name
  assert any((run_dir / 'tensorboard').iterdir())
  assert 'epsilon' in output and 'final eval accuracy' in output
  ledger = json.loads((run_dir / 'ledger.json').read_text())
  assert [r for r, _ in ledger['epsilon_per_round']] == [1, 2, 3, 4]
  epsilons = [e for _, e in ledger['epsilon_per_round']]
  assert epsilons == sorted(epsilons) and epsilons[0] > 0


def test_a_run_exits_at_once_with_every_file_whole(uninterrupted):
  # `scripts.train` exits without the interpreter's teardown
  # (`cli.run(..., fast_exit=True)`): nothing it wrote may be cut short.
  run_dir, output = uninterrupted
  rounds = [1, 2, 3, 4]
  assert [int(r['round']) for r in _rows(run_dir / 'metrics.csv')] == rounds
  assert release_managers.tensorboard_steps(
      str(run_dir / 'tensorboard')) == set(rounds)
  assert (run_dir / 'plot.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert json.loads((run_dir / 'summary.json').read_text())['rounds'] == 4
  assert output.endswith('checkpoints/)\n'), output[-300:]  # Last line whole.


@pytest.mark.slow
def test_killed_run_resumes_with_identical_metrics_and_ledger(uninterrupted,
                                                              tmp_path):
  run_dir, _ = uninterrupted
  args = [*SMALL, f'--root_output_dir={tmp_path}', '--experiment_name=run']
  as_a_user.kill_at(_train(args), 'round 2/4')
  done = _rows(tmp_path / 'run' / 'metrics.csv')
  assert 2 <= len(done) < 4
  checkpoints = sorted((tmp_path / 'run' / 'checkpoints').iterdir())
  assert checkpoints  # Killed after at least one checkpoint.

  proc = _train(args)
  output, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, output
  assert 'round 1/4' not in output  # Resumed, not restarted.
  assert 'Resuming' in output
  assert not list((tmp_path / 'run' / 'checkpoints').glob('*_temp*'))

  _assert_same_metrics(_rows(run_dir / 'metrics.csv'),
                       _rows(tmp_path / 'run' / 'metrics.csv'))
  ledger_a = json.loads((run_dir / 'ledger.json').read_text())
  ledger_b = json.loads((tmp_path / 'run' / 'ledger.json').read_text())
  np.testing.assert_allclose(ledger_b['epsilon_per_round'],
                             ledger_a['epsilon_per_round'], rtol=1e-12)
  assert ledger_b['ledger'] == ledger_a['ledger']


# ----------------------------------------------------------------------------
# Ctrl-C: one line saying where the same command goes on, and it does.


def test_ctrl_c_before_the_first_round_says_the_rerun_starts_the_run(
    tmp_path):
  args = [*SMALL, f'--root_output_dir={tmp_path}', '--experiment_name=run']
  proc = _train(args, process_group=0)
  rest = as_a_user.interrupt_at(proc, 'WARNING: --noise_seed')
  assert rest == 'interrupted: rerun the same command to start the run\n'
  assert proc.returncode == 130


@pytest.mark.slow
def test_ctrl_c_mid_run_names_the_round_the_rerun_resumes_from(uninterrupted,
                                                              tmp_path):
  run_dir, _ = uninterrupted
  args = [*SMALL, f'--root_output_dir={tmp_path}', '--experiment_name=run']
  proc = _train(args, process_group=0)
  rest = as_a_user.interrupt_at(proc, 'round 2/4')
  assert proc.returncode == 130
  *rounds, last = rest.splitlines()
  assert all(line.startswith('round ') for line in rounds), rest
  said = re.fullmatch(
      r'interrupted: rerun the same command to resume from round (\d)', last)
  assert said, rest
  next_round = int(said.group(1))
  assert 3 <= next_round <= 4

  proc = _train(args)
  output, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, output
  assert f'after round {next_round - 1} of 4.' in output
  assert f'round {next_round - 1}/4' not in output  # Not trained again.
  _assert_same_metrics(_rows(run_dir / 'metrics.csv'),
                       _rows(tmp_path / 'run' / 'metrics.csv'))
  ledger_a = json.loads((run_dir / 'ledger.json').read_text())
  ledger_b = json.loads((tmp_path / 'run' / 'ledger.json').read_text())
  assert ledger_b['ledger'] == ledger_a['ledger']


# ----------------------------------------------------------------------------
# Two TFF workers on 127.0.0.1 give the local run's metrics.


@pytest.mark.slow
def test_two_remote_workers_match_the_local_run(tmp_path):
  workers = [execution.start_worker() for _ in range(2)]
  base = training.TrainConfig(rounds=2, clients_per_round=6, eval_every=1,
                              root_output_dir=str(tmp_path), progress=False,
                              noise_seed=5)
  try:
    program.run(dataclasses.replace(base, experiment_name='local'))
    program.run(dataclasses.replace(
        base, experiment_name='remote', executor='remote',
        workers=tuple(f'127.0.0.1:{port}' for _, port in workers)))
  finally:
    execution.set_local_cpp_context()
    for proc, _ in workers:
      proc.terminate()
      proc.wait()
  _assert_same_metrics(_rows(tmp_path / 'local' / 'metrics.csv'),
                       _rows(tmp_path / 'remote' / 'metrics.csv'))


def test_too_many_clients_per_round_is_refused_before_training(tmp_path):
  config = training.TrainConfig(root_output_dir=str(tmp_path),
                                clients_per_round=10_000)
  try:
    with pytest.raises(training.ConfigError, match='clients_per_round'):
      program.run(config)
  finally:
    execution.set_local_cpp_context()
  assert not (tmp_path / 'default' / 'metrics.csv').exists()


def test_target_epsilon_calibrates_the_noise_multiplier():
  from tff_clip.privacy import accounting  # pylint: disable=g-import-not-at-top
  config = training.TrainConfig(noise_multiplier=None, target_epsilon=8.0,
                                rounds=20, clients_per_round=10)
  z = preflight.resolve_noise_multiplier(config, population=50)
  # By the accountant the run reports (PLD under Poisson sampling).
  achieved = accounting.report_epsilon(accounting.training_event(
      z, clients_per_round=10, population_size=50, rounds=20,
      sampling=accounting.POISSON), config.delta)
  assert achieved.accountant == accounting.PLD
  assert 0.995 * 8.0 <= achieved.epsilon <= 8.0


# ----------------------------------------------------------------------------
# What a DP run releases: secret noise, nothing data-dependent unaccounted.


def _first_seed_with_an_empty_round(rounds, population, clients_per_round):
  from tff_clip.privacy import sampling  # pylint: disable=g-import-not-at-top
  ids = [str(i) for i in range(population)]
  for seed in range(100):
    sampler = sampling.ClientSampler(ids, clients_per_round, 'poisson', seed)
    empty = [r for r in range(2, rounds + 1) if not sampler.sample(r)]
    if empty:
      return seed, empty[0]
  raise AssertionError('no seed with an empty round')


@functools.cache
def _sparse_seed():
  return _first_seed_with_an_empty_round(4, 50, 1)


def _shared(**changes):
  """The configuration of every in-process DP run below but the slow ones.

  They differ only in what a session is not built from (where they write,
  how long they run, what they release): one build serves them all (a build
  costs seconds, a round a fraction of one). 1 expected client of 50 under
  Poisson sampling, with a seed that leaves one of rounds 2-4 empty.
  """
  seed, _ = _sparse_seed()
  return dict(clients_per_round=1, eval_every=1, seed=seed,
              noise_multiplier=1.0, **changes)


def _run(tmp_path, name, **changes):
  config = training.TrainConfig(root_output_dir=str(tmp_path),
                                experiment_name=name, progress=False,
                                **changes)
  return program.run(config), tmp_path / name


def test_sparse_checkpoints_are_allowed_without_dp():
  program.validate(training.TrainConfig(
      bounding='none', noise_multiplier=None, checkpoint_every=5,
      checkpoint_interval_s=10.0))


class _Killed(Exception):
  pass


def test_dp_round_is_checkpointed_before_release_and_never_computed_twice(
    tmp_path, monkeypatch):
  # A kill after round 2's checkpoint and before its release (simulated by
  # the release raising): the resumed run releases round 2's saved row and
  # trains rounds 3-4 only. Re-running round 2 would release a second
  # aggregate under the same noise (a function of the key and the round).
  base = _shared(rounds=4)
  record = run_directory.RunState.record
  attempted = {}

  def record_until_round_2(self, round_num, row, event):
    if round_num == 2 and not attempted:
      attempted.update(row)
      raise _Killed()
    record(self, round_num, row, event)

  monkeypatch.setattr(run_directory.RunState, 'record', record_until_round_2)
  with pytest.raises(_Killed):
    _run(tmp_path, 'run', **base)
  assert [r['round'] for r in _rows(tmp_path / 'run' / 'metrics.csv')] == ['1']

  trained = []  # A DP round accounts its event once it ran.
  round_event = assembly.Session.round_event

  def recording_round_event(self, state, round_num):
    trained.append(round_num)
    return round_event(self, state, round_num)

  monkeypatch.setattr(assembly.Session, 'round_event', recording_round_event)
  summary, run_dir = _run(tmp_path, 'run', **base)
  assert trained == [3, 4]
  rows = _rows(run_dir / 'metrics.csv')
  assert [r['round'] for r in rows] == ['1', '2', '3', '4']
  # Round 2's row as computed before the kill, as released.
  assert set(rows[1]) == set(attempted)
  for key, value in rows[1].items():
    if key != 'round':
      np.testing.assert_equal(float(value), float(attempted[key]))
  ledger = json.loads((run_dir / 'ledger.json').read_text())
  assert [r for r, _ in ledger['epsilon_per_round']] == [1, 2, 3, 4]
  assert summary['epsilon'] == ledger['epsilon_per_round'][-1][1]


@pytest.fixture
def builds(monkeypatch):
  """The experiment names of the sessions built from here on."""
  built = []
  build = assembly.Session.__init__

  def counting_build(self, config, task_builder):
    built.append(config.experiment_name)
    build(self, config, task_builder)

  monkeypatch.setattr(assembly.Session, '__init__', counting_build)
  return built


def _state_keys(run_dir):
  """The [2] int64 leaves (noise keys) of a run's checkpoints."""
  keys = set()
  for path in (run_dir / 'checkpoints').iterdir():
    with np.load(path) as data:
      keys.update(tuple(data[n].tolist()) for n in data.files
                  if data[n].dtype == np.int64 and data[n].shape == (2,))
  return keys


def test_runs_in_one_process_share_their_build_never_their_noise(
    tmp_path, builds):
  # b differs from a only in where it writes, how long it runs and what it
  # releases: it reuses a's traced process, and draws its own noise keys
  # (value and count noise). Compared as keys, not as released values: two
  # fresh keys coincide with chance 2^-128, a clip norm with ~1e-6.
  base = _shared()
  a = _rows(_run(tmp_path, 'a', rounds=1, **base)[1] / 'metrics.csv')
  b = _rows(_run(tmp_path, 'b', rounds=2, release_uncovered_metrics=True,
                 **base)[1] / 'metrics.csv')
  assert 'b' not in builds
  keys_a, keys_b = _state_keys(tmp_path / 'a'), _state_keys(tmp_path / 'b')
  assert len(keys_a) == len(keys_b) == 2 and not keys_a & keys_b
  assert 'clients' in b[0] and 'clients' not in a[0]


def test_a_release_destination_is_one_release_manager_behind_the_filter(
    tmp_path):
  # Handed to the run, a `tff.program.ReleaseManager` gets each round's
  # released row, keyed by the round: under DP what epsilon covers (the
  # rows of metrics.csv), never the clients' metrics.
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  memory = tff.program.MemoryReleaseManager()
  config = training.TrainConfig(root_output_dir=str(tmp_path),
                                experiment_name='run', progress=False,
                                rounds=2, **_shared())
  training.run(config, program.build_task, release_managers=[memory])
  released = memory.values()
  assert list(released) == [1, 2]
  rows = _rows(tmp_path / 'run' / 'metrics.csv')
  # Every released column but the quantile, which only a run whose quantile
  # can move releases (this one tracks 0.03 from the start).
  # The epsilon column names its accountant and delta (PLD here).
  expected = (set(program_logic.RELEASED) - {'target_quantile', 'epsilon'} |
              {names.epsilon_key('pld', config.delta)})
  for round_num, row in zip(released, rows):
    assert set(released[round_num]) == set(row) == expected
    for key, value in row.items():
      assert float(value) == released[round_num][key], key


def test_a_run_another_process_is_training_is_refused_untouched(tmp_path):
  # Two processes training one run directory would interleave releases and
  # checkpoints. A second process holds the run's lock: this one refuses in
  # one line naming it and writes nothing; once it is gone the run trains.
  config = training.TrainConfig(root_output_dir=str(tmp_path),
                                experiment_name='run', progress=False,
                                rounds=1, **_shared())
  run_directory.prepare_output_dir(config)
  holder = subprocess.Popen(
      [sys.executable, '-c',
       'import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | '
       'os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b"4242"); '
       'print("locked", flush=True); sys.stdin.read()',
       str(tmp_path / 'run' / '.lock')],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'locked'
    before = {p.name: p.read_bytes() for p in (tmp_path / 'run').iterdir()}
    with pytest.raises(training.run_records.RunRecordError,
                       match=r'another process \(pid 4242\) is training'):
      program.run(config)
    assert {p.name: p.read_bytes()
            for p in (tmp_path / 'run').iterdir()} == before
  finally:
    holder.communicate('', timeout=60)
  summary = program.run(config)
  assert summary['rounds'] == 1 and (tmp_path / 'run' / 'summary.json').exists()


def test_a_calibrated_run_never_shares_a_build_of_other_rounds(monkeypatch):
  # Its noise multiplier is calibrated for its rounds when it is built.
  monkeypatch.setattr(assembly, '_sessions', collections.OrderedDict())
  monkeypatch.setattr(assembly, 'Session',
                      lambda config, task_builder: object())
  calibrated = training.TrainConfig(noise_multiplier=None, target_epsilon=4.0)
  fixed = training.TrainConfig()
  for config in (calibrated, fixed):
    first = assembly.session(config, print)
    assert assembly.session(dataclasses.replace(
        config, experiment_name='other', root_output_dir='elsewhere'),
                            print) is first
    longer = assembly.session(dataclasses.replace(config, rounds=60), print)
    assert (longer is first) == (config is fixed)


@pytest.mark.slow
def test_same_seed_runs_draw_different_noise_unless_noise_seed(
    tmp_path, builds):
  # a and b share a session and draw fresh keys; d reuses c's session and
  # equals it.
  base = dict(rounds=2, clients_per_round=6, eval_every=1, seed=4,
              sampling='fixed_size')
  runs = {name: _rows(_run(tmp_path, name, **base, **extra)[1] /
                      'metrics.csv')
          for name, extra in (('a', {}), ('b', {}),
                              ('c', dict(noise_seed=9)),
                              ('d', dict(noise_seed=9)))}
  assert 'b' not in builds and 'd' not in builds
  # Fresh keys for a and b (equal by chance with probability 2^-128), the
  # seed's for c and d.
  assert not _state_keys(tmp_path / 'a') & _state_keys(tmp_path / 'b')
  assert _state_keys(tmp_path / 'c') == _state_keys(tmp_path / 'd')
  _assert_same_metrics(runs['c'], runs['d'])
  summary = json.loads((tmp_path / 'c' / 'summary.json').read_text())
  assert 'NOT private' in summary['noise']
  assert 'NOT private' not in json.loads(
      (tmp_path / 'a' / 'summary.json').read_text())['noise']


@pytest.fixture(scope='module')
def sparse_poisson_run(tmp_path_factory):
  # 1 expected client of 50: many rounds draw nobody.
  _, empty_round = _sparse_seed()
  root = tmp_path_factory.mktemp('poisson')
  summary, run_dir = _run(root, 'run', rounds=4, **_shared())
  return summary, run_dir, empty_round


def test_poisson_run_releases_no_cohort_size_nor_client_metrics(
    sparse_poisson_run):
  summary, run_dir, _ = sparse_poisson_run
  rows = _rows(run_dir / 'metrics.csv')
  # The damped server step's scale: computed from released aggregates.
  assert set(rows[0]) == {'round', 'clip_norm', 'epsilon_pld_delta_1e-05',
                          'server_step_scale',
                          'eval_loss', 'eval_accuracy'}
  assert 'not_covered_by_epsilon' not in summary
  for name in ('summary.json', 'ledger.json'):
    text = (run_dir / name).read_text()
    assert '"clients"' not in text and 'train_loss' not in text


def test_empty_poisson_rounds_run_and_are_accounted(sparse_poisson_run):
  summary, run_dir, empty_round = sparse_poisson_run
  rows = _rows(run_dir / 'metrics.csv')
  assert [int(r['round']) for r in rows] == [1, 2, 3, 4]
  # The empty round still moved the model: its noise was added.
  before, after = (float(rows[empty_round - 2]['eval_loss']),
                   float(rows[empty_round - 1]['eval_loss']))
  assert before != after
  # dp_accounting's Poisson-sampled Gaussian composed over all 4 rounds:
  # the run's one accountant, PLD (no second figure beside it).
  import dp_accounting  # pylint: disable=g-import-not-at-top
  pld = dp_accounting.pld.PLDAccountant()
  pld.compose(dp_accounting.PoissonSampledDpEvent(
      1 / 50, dp_accounting.GaussianDpEvent(1.0)), 4)
  assert summary['epsilon'] == pytest.approx(pld.get_epsilon(1e-5), rel=0.01)
  assert summary['accountant'] == 'pld'
  assert not {'epsilon_rdp', 'epsilon_pld'} & set(summary)


def test_uncovered_metrics_are_released_only_on_request_and_labelled(
    tmp_path):
  summary, run_dir = _run(tmp_path, 'run', rounds=1,
                          **_shared(release_uncovered_metrics=True))
  assert {'clients', 'train_loss', 'seconds'} <= set(
      _rows(run_dir / 'metrics.csv')[0])
  assert {'clients', 'train_loss', 'seconds'} <= set(
      summary['not_covered_by_epsilon'])


def test_rerunning_a_finished_run_changes_nothing(sparse_poisson_run):
  summary, run_dir, _ = sparse_poisson_run
  before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
  again, _ = _run(run_dir.parent, 'run', rounds=4, **_shared())
  assert again == json.loads(before['summary.json'])
  assert {p.name: p.read_bytes() for p in run_dir.iterdir()
          if p.is_file()} == before
  json.loads(before['summary.json'], parse_constant=pytest.fail)  # Strict.


# ----------------------------------------------------------------------------
# Quiet runs: no TensorFlow log line that does not concern the run.


def test_a_run_prints_no_tensorflow_log_lines(uninterrupted):
  _, output = uninterrupted  # stdout and stderr of a run from a user's shell
  tf_lines = [line for line in output.splitlines() if re.match(
      r'(\d{4}-\d\d-\d\d [\d:.]+: [EWF] |[EWF]\d{4} |WARNING:tensorflow)',
      line)]
  assert not tf_lines, output


def test_a_run_ends_without_a_traceback(uninterrupted):
  # Traced functions freed during interpreter shutdown print TensorFlow's
  # "Exception ignored in: AtomicFunction.__del__" tracebacks.
  _, output = uninterrupted
  assert 'Traceback' not in output and 'Exception ignored' not in output, (
      output[-3000:])


def test_progress_lines_show_accuracy_only_once_it_is_measured(capsys):
  # Evaluated every 2 rounds: round 1 has no accuracy yet (not `acc=nan`).
  progress = training._Progress(  # pylint: disable=protected-access
      training.TrainConfig(rounds=2, eval_every=2, progress=False), 1,
      released=lambda path: True)
  progress.update(1, {'clip_norm': 0.5}, {})
  progress.update(2, {'clip_norm': 0.5}, {'eval_accuracy': 0.25})
  first, second = capsys.readouterr().out.splitlines()
  assert first == 'round 1/2 clip=0.5'
  assert second == 'round 2/2 clip=0.5 acc=0.25'
