"""Specification: a bad value is refused at once, a fault is one line.

`scripts.train` refuses every value it can judge without data before it
imports TensorFlow (about a second): one line on stderr, exit code 2,
nothing written. Among them are values that would otherwise change what a
run is without a word: an empty flag (an unset shell variable), z = 0, a z
or a C that TensorFlow flushes to 0, a product z C that overflows, a cohort
larger than a minimum-separation group. The library checks the numbers its
mechanism computes (z C, the noisy sum and mean) in the dtypes it computes
them, once, in `tff_clip.aggregation.spec.DPSpec`. A full disk or a kill ends in one
line, loses no record, and TensorBoard, a view of `releases.jsonl`, gets
every released round on the rerun.
"""

import asyncio
import collections
import dataclasses
import errno
import math
import os
import re

import dp_accounting
from dp_accounting import rdp
import numpy as np
import portpicker
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from scripts import program
from tff_clip.aggregation import aggregators
from tff_clip.aggregation import dp
from tff_clip.aggregation import spec
from tff_clip.privacy import accounting
from tff_clip.program import assembly
from tff_clip.program import config as config_lib
from tff_clip.program import plotting
from tff_clip.program import preflight
from tff_clip.program import release_managers
from tff_clip.program import training
from tff_clip.program import run_directory
from tff_clip.program import run_records
import as_a_user  # pylint: disable=g-bad-import-order

# `scripts.train` as a user runs it; the process fails if a module of
# $NOT_IMPORTED (TensorFlow: a refusal never needs it) was imported by the
# time it exits. Deterministic, unlike a time limit on a loaded machine.
_TRAIN = '''
import os, sys
from scripts import cli, train
sys.argv = ['scripts.train', *sys.argv[1:]]
try:
  cli.run(train.main)
finally:
  imported = [name for name in os.environ['NOT_IMPORTED'].split(',')
              if name in sys.modules]
  assert not imported, f'imported: {imported}'
'''


def _refusal(tmp_path, *args, not_imported=('tensorflow',)):
  """The one line `scripts.train *args` refuses with; nothing is written."""
  runs = tmp_path / 'runs'
  proc = as_a_user.python(_TRAIN, f'--root_output_dir={runs}', *args,
                          timeout=120, NOT_IMPORTED=','.join(not_imported))
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stdout == ''
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
  assert not runs.exists()
  return lines[0]


@pytest.fixture(scope='module')
def early_refusals(tmp_path_factory):
  """`early_refusals(*args)`: `_refusal`'s line for each command line of
  CHANGES_THE_RUN, BAD_FLAGS, FEASIBLE_COHORT and DEFAULT_COHORT, all refused in turn in
  one interpreter (`as_a_user.train_each`)."""
  commands = [tuple(args) for args, _ in CHANGES_THE_RUN + BAD_FLAGS]
  commands += [FEASIBLE_COHORT, DEFAULT_COHORT]
  roots = [tmp_path_factory.mktemp('refused') / 'runs' for _ in commands]
  results = dict(zip(commands, zip(as_a_user.train_each(
      [[f'--root_output_dir={root}', *args]
       for args, root in zip(commands, roots)],
      not_imported=['tensorflow']), roots, strict=True)))

  def line(*args):
    (code, stdout, stderr, imported), root = results[args]
    assert not imported, f'imported: {imported}'
    assert code == 2, stderr[-3000:]
    assert stdout == ''
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), stderr
    assert not root.exists()
    return lines[0]
  return line


# ----------------------------------------------------------------------------
# Values that would change what a run is, silently.


CHANGES_THE_RUN = [
    # An unset `$Z` must not turn DP off ...
    (['--noise_multiplier='], r"--noise_multiplier .*empty.*'none'"),
    (['--lus_sparsity='], r"--lus_sparsity is empty.*'none'"),
    # ... nor z = 0 pass for a DP run (epsilon infinite, noise "secret").
    (['--noise_multiplier=0'], r'--noise_multiplier=0 adds no noise.*'
     r'--noise_multiplier=none'),
    # Subnormal in float32: TensorFlow flushes it to 0 (no noise added).
    (['--noise_multiplier=1e-45'], r'--noise_multiplier = 1e-45 is '
     r'subnormal in float32'),
    (['--clip_norm=1e-40'], r'--clip_norm = 1e-40 is subnormal'),
    # A flag where it changes nothing: the user would believe it did.
    (['--clip_norm=1', '--target_quantile=0.5'],
     r'--target_quantile=0.5 applies only with an adaptive clip_norm'),
    (['--clip_norm=1', '--initial_clip_norm=0.5'],
     r'--initial_clip_norm=0.5 applies only with an adaptive clip_norm'),
    (['--bounding=per_layer_clip', '--split=uniform'],
     r'--split=uniform applies only with a per_layer_ bounding of one norm'),
    (['--noise_multiplier=none', '--clipped_count_stddev=2'],
     r'--clipped_count_stddev=2.0 applies only with DP'),
    (['--server_momentum=0.5'],
     r'--server_momentum=0.5 applies only with --server_optimizer=sgdm'),
    (['--audit_confidence=0.5'],
     r'--audit_confidence=0.5 applies only with --audit_canaries'),
    (['--clip_norm=1', '--clipped_count_stddev=2'],
     r'--clipped_count_stddev=2.0 applies only with an adaptive clip_norm'),
    # No bounding: no norm, no quantile (BLUR's radius is --clip_norm).
    (['--bounding=none', '--clip_norm=0.5'],
     r'--clip_norm=0.5 applies only with a bounding \(--bounding other '),
    (['--bounding=none', '--target_quantile=0.3'],
     r'--target_quantile=0.3 applies only with a bounding'),
    (['--bounding=none', '--split=uniform'],
     r'--split=uniform applies only with a per_layer_ bounding'),
    (['--bounding=none', '--clip_learning_rate=0.5'],
     r'--clip_learning_rate=0.5 applies only with a bounding'),
    (['--bands=4'], r'--bands=4 applies only with correlated noise'),
    (['--min_separation=3'],
     r'--min_separation=3 applies only with --sampling=min_separation'),
    (['--blt_buffers=2'], r'--blt_buffers=2 applies only with '
     r'noise_mechanism blt'),
    (['--bounding=clip', '--split=uniform'],
     r'--split=uniform applies only with a per_layer_ bounding'),
    # Client noise is n shares of the noise: a Poisson cohort of m < n
    # clients adds less than the ledger accounts.
    (['--noise_placement=client'],
     r'--noise_placement=client under Poisson sampling.*fixed_size'),
    # Each value alone is fine; z C overflows float32 (every output NaN).
    (['--clip_norm=3e38', '--noise_multiplier=10'],
     r'--clip_norm = 3e\+38, --noise_multiplier = 10 .*beyond float32'),
    # 50 digits clients in 4 groups of 12 or 13 cannot give 13 per round:
    # a group of 12's sum would be divided by 13.
    (['--sampling=min_separation', '--noise_mechanism=banded', '--bands=4',
      '--clients_per_round=13'],
     r'--clients_per_round \(13\) exceeds the smallest minimum-separation '
     r'group: the 50 clients fall into 4 groups of 12 to 13.*at most 12'),
    (['--clients_per_round=1000'],
     r'--clients_per_round \(1000\) exceeds the number of training clients '
     r'\(50\)'),
    # More groups than the 50 digits clients: the separation is at fault,
    # not the cohort (left to its default, one client of the smallest).
    (['--sampling=min_separation', '--noise_mechanism=banded', '--bands=4',
      '--min_separation=100'],
     r'^error: --min_separation \(100\) exceeds the 50 clients.*at most 50'),
]


@pytest.mark.parametrize('fields, message', [
    (dict(bounding='none', noise_multiplier=None, target_quantile=0.3),
     r'^--target_quantile=0.3 applies only with a bounding'),
    (dict(server_momentum=0.5),
     r'^--server_momentum=0.5 applies only with --server_optimizer=sgdm'),
    (dict(noise_multiplier=None, clipped_count_stddev=2.0),
     r'^--clipped_count_stddev=2.0 applies only with DP'),
])
def test_the_library_program_refuses_a_field_that_changes_nothing(
    tmp_path, fields, message):
  """`training.run`, the program the wheel installs, refuses as the script
  does: before the task is built or anything is written."""
  def no_task(config):
    raise AssertionError(f'a task was built for {config}')

  config = config_lib.TrainConfig(root_output_dir=str(tmp_path), **fields)
  with pytest.raises(config_lib.ConfigError, match=message):
    training.run(config, no_task)
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize('args, message', CHANGES_THE_RUN)
def test_a_value_that_changes_the_run_is_refused_before_tensorflow(
    early_refusals, args, message):
  line = early_refusals(*args)
  assert re.search(message, line), line


FEASIBLE_COHORT = ('--sampling=min_separation', '--noise_mechanism=banded',
                   '--bands=4', '--clients_per_round=9', '--rounds=0')
DEFAULT_COHORT = (*FEASIBLE_COHORT[:3], '--rounds=0')


def test_a_feasible_minimum_separation_cohort_passes_the_early_checks(
    early_refusals):
  # Refused only for --rounds: the groups (12 or 13 clients) hold 9.
  line = early_refusals(*FEASIBLE_COHORT)
  assert '--rounds' in line
  # Without --clients_per_round: the smallest group, 12, passes too.
  line = early_refusals(*DEFAULT_COHORT)
  assert '--rounds' in line


@pytest.mark.parametrize('population, bands, cohort', [
    (50, 4, 12),  # digits: groups of 12 or 13.
    (100, 20, 5),  # --task=emnist_cnn --num_clients=100: groups of 5.
    (1_000, 20, 50),
    (342_477, 342, 1_001),  # Stack Overflow's shape: 1,001 or 1,002.
])
def test_a_separated_run_trains_its_smallest_group_by_default(
    population, bands, cohort):
  config = config_lib.TrainConfig(sampling='min_separation', bands=bands,
                                  noise_mechanism='banded')
  assert config.clients_per_round is None
  assert preflight.with_population(config, population).clients_per_round == (
      cohort)
  given = dataclasses.replace(config, clients_per_round=3)
  assert preflight.with_population(given, population) is given
  # Other samplings keep their default of 20, and its directory: the
  # command with it given names the same run as the one without.
  assert config_lib.TrainConfig().clients_per_round == 20
  for explicit in ({}, {'clients_per_round': 20}):
    assert config_lib.TrainConfig(**explicit).experiment_name == (
        'digits_noise_following_dp_seed0')


# ----------------------------------------------------------------------------
# A noise state that cannot fit in memory: refused before it is allocated.

# Stack Overflow's LSTM (4,050,748 parameters) with banded noise at the
# published separation b = 342: 341 past noise vectors of float32.
LSTM_PARAMETERS = 4_050_748


def test_published_banded_noise_on_the_lstm_is_refused_with_its_need():
  config = config_lib.TrainConfig(
      noise_mechanism='banded', bands=342, sampling='min_separation',
      rounds=2052, noise_multiplier=1.0)
  state = 341 * LSTM_PARAMETERS * 4
  need = preflight.STATE_COPIES_AT_PEAK * state
  assert 35 < need / 2**30 < 40
  with pytest.raises(config_lib.ConfigError) as refusal:
    preflight.check_noise_memory(config, LSTM_PARAMETERS, available=23 * 2**30)
  assert str(refusal.value) == (
      '--noise_mechanism=banded: its state holds 341 noise vectors of '
      f'4,050,748 parameters ({state / 2**30:.1f} GiB); a DP round holds '
      f'about {preflight.STATE_COPIES_AT_PEAK} copies of it, so it needs '
      f'about {need / 2**30:.1f} GiB, and this machine has 23.0 GiB '
      'available. Use fewer --bands, --noise_mechanism=blt or a smaller '
      'model.')
  preflight.check_noise_memory(config, LSTM_PARAMETERS, available=need)


def test_a_noise_state_beyond_memory_is_refused_before_the_process_is_built(
    tmp_path, monkeypatch):
  """A run's banded state (3 vectors of the digits model) against a fake,
  tiny amount of free memory: one `ConfigError` (the program's exit 2),
  before tracing, `initialize` or any file."""
  config = config_lib.TrainConfig(
      root_output_dir=str(tmp_path / 'runs'), noise_mechanism='banded',
      bands=4, sampling='min_separation', clients_per_round=9, rounds=4,
      progress=False)
  task = program.build_task(config)
  parameters = sum(np.size(v) for v in task.model_fn().trainable_variables)
  need = preflight.STATE_COPIES_AT_PEAK * 3 * parameters * 4
  monkeypatch.setattr(preflight, 'available_memory', lambda: need - 1)
  monkeypatch.setattr(assembly, 'build_process', lambda *args: pytest.fail(
      'the process was built'))
  with pytest.raises(config_lib.ConfigError,
                     match=f'3 noise vectors of {parameters:,} parameters'):
    program.run(config)
  assert not (tmp_path / 'runs').exists()


# ----------------------------------------------------------------------------
# Flags checked early and strictly.


BAD_FLAGS = [
    (['--seed=-1'], '--seed must be an integer in [0, 4294967295]'),
    ([f'--seed={2**70}'], '--seed must be an integer in [0, 4294967295]'),
    (['--root_output_dir='], '--root_output_dir must name a directory'),
    (['--experiment_name=a\nb'], '--experiment_name must be printable'),
    (['--experiment_name=a\x7fb'], '--experiment_name must be printable'),
    (['--experiment_name=' + 'x' * 5000],
     '--experiment_name is too long for a file system'),
    (['--task_option=depth=3'],
     "--task_option 'depth' is not an option of task 'digits'"),
    # absl's own words begin 'ERROR::'; the line names the flag instead.
    (['--flagfile=no_such_flags.cfg'],
     "error: --flagfile: Unable to open flagfile: [Errno 2] No such file or "
     "directory: 'no_such_flags.cfg'"),
]


@pytest.mark.parametrize('args, flag', BAD_FLAGS)
def test_a_bad_flag_is_refused_before_tensorflow(early_refusals, args, flag):
  assert flag in early_refusals(*args)


# A bad output directory is refused at once: before TensorFlow and before
# dp_accounting (half a second), within the time of any bad flag.
AT_ONCE = ('tensorflow', 'dp_accounting')


def test_a_target_epsilon_below_rdps_floor_is_refused_at_once(tmp_path):
  # At delta = 1e-5 RDP accounting proves no epsilon below ~0.0035, at any
  # noise (dp_accounting's own epsilon under huge noise); the library's
  # calibration refuses it in the same words.
  floor = rdp.RdpAccountant().compose(
      dp_accounting.GaussianDpEvent(5e4)).get_epsilon(1e-5)
  with pytest.raises(ValueError) as refused:
    accounting.calibrate_noise_multiplier(1e-6, 20, 50, 100, 1e-5)

  line = _refusal(tmp_path, '--noise_multiplier=none',
                  '--target_epsilon=1e-6', '--delta=1e-5',
                  not_imported=AT_ONCE)

  assert line == f'error: --target_epsilon: {refused.value}'
  assert f'cannot prove less than epsilon = {floor:.3g}' in line


def test_a_file_as_root_output_dir_is_refused_at_once(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('mine')
  line = _refusal(tmp_path, f'--root_output_dir={blocker}',
                  not_imported=AT_ONCE)
  assert line == (f"error: --root_output_dir: cannot create '{blocker}/"
                  f"{config_lib.TrainConfig().experiment_name}' "
                  f"('{blocker}' is not a writable directory).")
  assert blocker.read_text() == 'mine'


def test_an_output_directory_the_file_system_refuses_is_refused_at_once(
    tmp_path):
  # /proc takes no directory, whoever asks (root included, whom permission
  # bits never stop): asked of the file system, not of the bits.
  line = _refusal(tmp_path, '--root_output_dir=/proc/tff_clip_runs',
                  not_imported=AT_ONCE)
  assert line.startswith("error: --root_output_dir: cannot write in '/proc' (")
  assert not os.path.exists('/proc/tff_clip_runs')


def test_a_run_of_another_configuration_in_the_directory_is_refused_at_once(
    tmp_path):
  # The run there is left as it was, and resumes with its own flags.
  runs = tmp_path / 'runs'
  config = config_lib.TrainConfig(root_output_dir=str(runs),
                                  experiment_name='run', rounds=3)
  run_directory.prepare_output_dir(config)
  recorded = (runs / 'run' / 'config.json').read_bytes()
  proc = as_a_user.python(_TRAIN, f'--root_output_dir={runs}',
                          '--experiment_name=run', '--rounds=4', timeout=120,
                          NOT_IMPORTED=','.join(AT_ONCE))
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert re.fullmatch(r"error: '.*run' holds a run with a different "
                      r'configuration \(differs in: rounds\).*\n',
                      proc.stderr), proc.stderr
  assert sorted(os.listdir(runs / 'run')) == ['config.json']
  assert (runs / 'run' / 'config.json').read_bytes() == recorded
  assert run_directory.existing_run(config) == 'resume'


def test_the_writability_probe_leaves_nothing_behind(tmp_path):
  config = config_lib.TrainConfig(root_output_dir=str(tmp_path / 'a' / 'b'))
  run_directory.check_writable(config)  # Probed in tmp_path.
  (tmp_path / 'run').mkdir()
  run_directory.check_writable(dataclasses.replace(
      config, root_output_dir=str(tmp_path), experiment_name='run'))
  assert sorted(os.listdir(tmp_path)) == ['run']
  assert not os.listdir(tmp_path / 'run')


def test_an_unreachable_worker_is_refused_before_tensorflow(tmp_path):
  port = portpicker.pick_unused_port()
  line = _refusal(tmp_path, '--executor=remote',
                  f'--workers=127.0.0.1:{port}', '--worker_timeout_s=600')
  assert f'--workers: TFF worker at 127.0.0.1:{port} is unreachable' in line


# ----------------------------------------------------------------------------
# The library: the products a mechanism computes, in its dtypes.

PRIVACY = dict(noise_multiplier=1.0, clients_per_round=10.0, clip_norm=1.0)


@pytest.mark.parametrize('changes, message', [
    (dict(clip_norm=3e38, noise_multiplier=10.0),
     r'`clip_norm` = 3e\+38, `noise_multiplier` = 10 .*noisy sum.*float32'),
    (dict(clip_norm=1e-40), r'`clip_norm` = 1e-40 is subnormal in float32'),
    (dict(clip_norm='adaptive', initial_clip_norm=1e-40),
     r'`initial_clip_norm` = 1e-40 is subnormal'),
    (dict(noise_multiplier=1e-45), r'`noise_multiplier` = 1e-45 is subnormal'),
    (dict(clip_norm=1e-30, noise_multiplier=1e-10),
     r'noise std 1e-40 is below 1.97e-31'),
])
def test_a_product_the_mechanism_cannot_hold_is_refused_naming_its_terms(
    changes, message):
  with pytest.raises(ValueError, match=message):
    spec.DPSpec('clip', **{**PRIVACY, **changes})
  with pytest.raises(ValueError, match=message):
    dp.dp_factory('clip', **{**PRIVACY, **changes})


def test_float16_updates_are_refused_where_the_noisy_mean_overflows():
  # z C / n = 1e4: about 94% of the coordinates would come out inf.
  factory = dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=1.0,
                          clip_norm=1e4)
  with pytest.raises(ValueError, match=r'noisy mean .*float16'):
    factory.create(tff.TensorType(np.float16, [3]))
  factory.create(tff.TensorType(np.float32, [3]))  # float32 holds it.


def test_noise_that_rounds_to_zero_in_the_update_dtype_is_refused():
  factory = dp.dp_factory('clip', noise_multiplier=1e-3,
                          clients_per_round=1e6, clip_norm=1e-3)
  with pytest.raises(ValueError, match='rounds to 0 in float16'):
    factory.create(tff.TensorType(np.float16, [3]))


def test_a_subnormal_per_layer_budget_is_refused():
  # 'dim' gives the 1-entry layer C sqrt(1 / 1e6) = 1e-3 C, subnormal.
  value_type = tff.types.to_type(collections.OrderedDict(
      b=tff.TensorType(np.float32, [1]),
      w=tff.TensorType(np.float32, [10**6])))
  # (z = 10^6 keeps the noise std, 1e-30, above the least one drawn.)
  factory = dp.dp_factory('per_layer_clip', noise_multiplier=1e6,
                          clients_per_round=10.0, clip_norm=1e-36)
  with pytest.raises(ValueError, match=r'`split`: layer 0 gets the budget'):
    factory.create(value_type)


def test_a_good_float16_mechanism_still_builds():
  dp.dp_factory('clip', noise_multiplier=1.0, clients_per_round=10.0,
                clip_norm=1.0).create(tff.TensorType(np.float16, [3]))


@pytest.mark.parametrize('factory', [
    lambda: dp.dp_factory('clip', **PRIVACY),
    lambda: aggregators.clip_factory(1.0),
])
def test_a_structure_of_zero_size_tensors_is_refused_naming_it(factory):
  value_type = tff.StructType([('w', tff.TensorType(np.float32, [0, 3])),
                               ('b', tff.TensorType(np.float32, [0]))])
  with pytest.raises(ValueError, match='`value_type` has no elements'):
    factory().create(value_type)


def test_z_zero_is_a_noise_free_aggregate_in_the_library_but_not_a_dp_run():
  spec.DPSpec('clip', **{**PRIVACY, 'noise_multiplier': 0.0})
  with pytest.raises(config_lib.ConfigError, match='--noise_multiplier=0'):
    config_lib.validate(config_lib.TrainConfig(noise_multiplier=0.0))


# ----------------------------------------------------------------------------
# Faults: one line, nothing lost, a rerun completes the views.


def _tensorboard(run_dir, resuming):
  """The run's TensorBoard view of its records (`releases.jsonl`)."""
  return release_managers.TensorBoardView(
      str(run_dir / 'tensorboard'), run_records.ReleaseLog(str(run_dir)),
      resuming)


def _release(run_dir, view, round_num, row):
  """Round `round_num` released as the round loop does: recorded, shown."""
  run_records.ReleaseLog(str(run_dir)).append(round_num, row, None)
  if view is not None:
    asyncio.run(view.release(row, key=round_num))


def _steps(run_dir):
  return release_managers.tensorboard_steps(str(run_dir / 'tensorboard'))


def _row(round_num, **values):
  return dict(round=round_num, epsilon=math.inf, clip_norm=0.5,
              eval_loss=math.nan, eval_accuracy=math.nan, **values)


def test_a_rerun_writes_tensorboard_the_rounds_a_kill_left_out(tmp_path):
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  _release(run_dir, _tensorboard(run_dir, resuming=False), 1, _row(1))
  _release(run_dir, None, 2, _row(2))  # Killed before its TensorBoard write.
  assert _steps(run_dir) == {1}
  view = _tensorboard(run_dir, resuming=True)
  assert _steps(run_dir) == {1, 2}
  _release(run_dir, view, 3, _row(3))
  assert _steps(run_dir) == {1, 2, 3}


def test_a_value_beyond_float32_is_left_out_of_tensorboard_not_fatal(
    tmp_path):
  # The epsilon of a tiny z (1e60) is released in the records; TensorBoard
  # (float32) leaves it out, as it does inf, instead of failing every rerun.
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  _release(run_dir, _tensorboard(run_dir, resuming=False), 1,
           _row(1, objective=1e60))
  assert _steps(run_dir) == {1}
  assert run_records.ReleaseLog(str(run_dir)).rows()[0]['objective'] == 1e60


def test_a_tensorboard_writer_that_cannot_be_created_is_one_line(
    tmp_path, monkeypatch):
  def full_disk(*unused_args, **unused_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(release_managers, '_EventFile', full_disk)
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  with pytest.raises(run_records.RunRecordError) as error:
    _release(run_dir, _tensorboard(run_dir, resuming=False), 1, _row(1))
  message = str(error.value)
  assert '\n' not in message
  assert message.startswith(f'cannot write {run_dir / "tensorboard"}: no '
                            'space left on the device.')


_PLOT_WITH_FILE_SIZE_LIMIT = '''
import resource, signal, sys
from tff_clip.program import plotting, run_records
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # A write past it: EFBIG.
resource.setrlimit(resource.RLIMIT_FSIZE, (8000, resource.RLIM_INFINITY))
try:
  plotting.plot_metrics(sys.argv[1], sys.argv[2], 'run')
except run_records.RunRecordError as e:
  print(e)
'''


def test_a_plot_that_does_not_fit_is_one_line_and_leaves_no_partial_file(
    tmp_path):
  csv_path = tmp_path / 'metrics.csv'
  csv_path.write_text('round,eval_accuracy,train_loss,clip_norm,epsilon\n' +
                      ''.join(f'{r},0.{r},1.{r},0.5,{r}\n'
                              for r in range(1, 30)))
  png = tmp_path / 'plot.png'
  proc = as_a_user.python(_PLOT_WITH_FILE_SIZE_LIMIT, csv_path, png,
                          timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.startswith(f'cannot write {png}: ')
  assert proc.stdout.count('\n') == 1
  assert sorted(os.listdir(tmp_path)) == ['metrics.csv']  # No plot, no tmp.
  plotting.plot_metrics(str(csv_path), str(png), 'run')  # Space again.
  assert png.read_bytes().startswith(b'\x89PNG')


def test_a_full_disk_while_plotting_is_a_record_error_not_a_traceback(
    tmp_path, monkeypatch):
  csv_path = tmp_path / 'metrics.csv'
  csv_path.write_text('round,eval_accuracy\n1,0.5\n')

  def no_space(*unused_args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, 'fsync', no_space)
  with pytest.raises(run_records.RunRecordError, match='No space left'):
    plotting.plot_metrics(str(csv_path), str(tmp_path / 'plot.png'))
  assert sorted(os.listdir(tmp_path)) == ['metrics.csv']


_PLOT_AFTER_A_HALF_DONE_IMPORT = '''
import importlib.abc, sys
from tff_clip.program import plotting

class FailsOnce(importlib.abc.MetaPathFinder):
  failed = False
  def find_spec(self, name, path, target=None):
    if name == 'matplotlib.colorizer' and not FailsOnce.failed:
      FailsOnce.failed = True  # As a deadlock-checked import, midway.
      raise ImportError('interrupted')

sys.meta_path.insert(0, FailsOnce())
plotting.import_in_background()
plotting.plot_metrics(sys.argv[1], sys.argv[2], 'run')
for name in ('matplotlib', 'matplotlib.pyplot'):  # Restored around it.
  del sys.modules[name]
plotting.plot_metrics(sys.argv[1], sys.argv[3], 'run')
print(FailsOnce.failed)
'''


def test_a_plot_after_a_half_done_matplotlib_import_still_draws(tmp_path):
  # The background import a run starts can be cut short midway (a deadlock
  # check, a test restoring sys.modules); its leftovers once broke every
  # later plot in the process with "no attribute '_docstring'".
  csv_path = tmp_path / 'metrics.csv'
  csv_path.write_text('round,eval_accuracy\n1,0.5\n2,0.6\n')
  pngs = tmp_path / 'first.png', tmp_path / 'second.png'
  proc = as_a_user.python(_PLOT_AFTER_A_HALF_DONE_IMPORT, csv_path, *pngs,
                          timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ['True']
  for png in pngs:
    assert png.read_bytes().startswith(b'\x89PNG')
