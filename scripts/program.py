"""The training program's tasks: `--task` names and options -> a TFF task.

`tff_clip.program.training` is the program logic and takes any task from its
caller (`training.run(config, task_builder)`); this module resolves the
names of this repository's `tasks` (`--task`, `--data_source`,
`--partition`, `--task_option`), and is what `scripts.train`, the sweeps,
benchmarks and reproductions call. The library (`tff_clip`) never imports
`tasks` or `scripts`.
"""

import atexit
import collections
import contextlib
import glob
import math
import os
import socket

from tff_clip import checks
from tff_clip.privacy import rdp_floor
from tff_clip.program import config as config_lib
from tff_clip.program.config import ConfigError, TrainConfig

__all__ = ['build_task', 'format_epsilon', 'format_summary',
           'meaning_of_epsilon', 'preflight', 'run', 'validate']


def _check_task_options(config):
  if not config.task_options:
    return
  keys = [pair[0] if isinstance(pair, tuple) and len(pair) == 2 else None
          for pair in config.task_options]
  if None in keys:
    raise ConfigError('--task_option must be key=value pairs; got '
                      f'{config.task_options!r}.')
  # The registry's option lists, read without importing TensorFlow.
  from tasks import names as task_names  # pylint: disable=g-import-not-at-top
  accepted = task_names.TASK_OPTIONS[config.task]
  for key in keys:
    if keys.count(key) > 1:
      raise ConfigError(f'--task_option {key!r} is given twice.')
    if key not in accepted:
      raise ConfigError(
          f'--task_option {key!r} is not an option of task {config.task!r}; '
          f'its options are: {", ".join(accepted) or "none"}.')
  for key, value in config.task_options:
    bounds = task_names.INTEGER_OPTIONS.get((config.task, key))
    if bounds is not None:  # A size: refused before TensorFlow builds it.
      try:
        checks.integer(value, key, *bounds)
      except (TypeError, ValueError) as e:
        raise ConfigError(f'--task_option {str(e).replace("`", "")}'
                          ) from None


def _check_task(config):
  # The task registry's names, read without importing TensorFlow.
  from tasks import names as task_names  # pylint: disable=g-import-not-at-top
  config_lib.one_of(config.task, 'task', task_names.TASK_NAMES)
  if config.partition is not None:
    if config.task not in task_names.PARTITIONABLE:
      raise ConfigError(f'--partition applies to image tasks '
                        f'({", ".join(task_names.PARTITIONABLE)}); '
                        f'{config.task!r} has its own clients.')
    config_lib.one_of(config.partition, 'partition',
                      task_names.PARTITION_NAMES)
  _check_task_options(config)
  sources = task_names.DATA_SOURCES[config.task]
  if config.data_source not in sources:
    raise ConfigError(f'--data_source for {config.task!r} must be one of '
                      f'{", ".join(sources)}; got {config.data_source!r}.')


def validate(config: TrainConfig) -> None:
  """`tff_clip.program.config.validate` and the task flags; `ConfigError` names one."""
  config_lib.validate(config)
  if config.target_epsilon is not None:
    # Below RDP's floor at --delta no noise reaches the target: said in
    # microseconds, before dp_accounting (half a second) is imported; the
    # calibration refuses the same with the same words.
    try:
      rdp_floor.check_reachable(config.target_epsilon, config.delta)
    except ValueError as e:
      raise ConfigError(f'--target_epsilon: {e}') from None
  _check_task(config)


def _check_population(config):
  """What the population decides, where the task fixes it without data."""
  from tasks import names as task_names  # pylint: disable=g-import-not-at-top
  from tff_clip.privacy import sampling  # pylint: disable=g-import-not-at-top
  population = task_names.population(config.task, config.data_source,
                                     config.num_clients)
  if population is not None:  # A separated run's default: its smallest group.
    from tff_clip.program import preflight as checks_before_build  # pylint: disable=g-import-not-at-top
    config = checks_before_build.with_population(config, population)
  if config.clients_per_round is None:
    return  # Resolved once the task counts its clients.
  if population is not None and config.clients_per_round > population:
    raise ConfigError(
        f'--clients_per_round ({config.clients_per_round}) exceeds the '
        f'number of training clients ({population}).')
  ids = task_names.client_ids(config.task, config.data_source,
                              config.num_clients)
  if ids is not None and config.sampling == sampling.MIN_SEPARATION:
    try:  # The groups are a function of (seed, client ids): known already.
      sampling.ClientSampler(ids, config.clients_per_round, config.sampling,
                             config.seed, config.separation)
    except ValueError as e:
      raise config_lib.flag_error(e) from None
  if config.target_epsilon is not None and (
      population is not None or config.sampling == sampling.MIN_SEPARATION):
    from tff_clip.program import preflight as checks_before_build  # pylint: disable=g-import-not-at-top
    noise_multiplier = checks_before_build.resolve_noise_multiplier(
        config, population or config.clients_per_round)
    # The calibrated z, checked as a given one would be (z C, z C / n).
    config_lib.check_noise(config, noise_multiplier)


def _check_workers(config):
  """Refuses at once a --workers address where nothing listens."""
  if config.executor != 'remote':
    return
  for worker in config.workers:
    host, _, port = str(worker).rpartition(':')
    try:
      socket.create_connection(
          (host, int(port)), timeout=min(5.0, config.worker_timeout_s)).close()
    except (OSError, ValueError) as e:
      raise ConfigError(f'--workers: TFF worker at {worker} is unreachable '
                        f'({e}).') from None


def no_gpu_reason(environ=None, devices='/dev'):
  """Why TensorFlow would see no GPU, known without importing it; None
  where one may be visible (TensorFlow's own check then decides).

  TensorFlow's CUDA build sees a GPU through the NVIDIA driver's device
  files (/dev/nvidia0, ...; /dev/dxg under WSL) and not at all when
  CUDA_VISIBLE_DEVICES is empty or -1.
  """
  environ = os.environ if environ is None else environ
  visible = environ.get('CUDA_VISIBLE_DEVICES')
  if visible is not None and visible.strip() in ('', '-1'):
    return f'CUDA_VISIBLE_DEVICES={visible!r} hides every GPU'
  if not (glob.glob(os.path.join(devices, 'nvidia[0-9]*')) or
          os.path.exists(os.path.join(devices, 'dxg'))):
    return f'this machine has no NVIDIA GPU device ({devices}/nvidia0, ...)'
  return None


def _check_gpu(config):
  if config.executor != 'gpu':
    return
  reason = no_gpu_reason()
  if reason is not None:
    raise ConfigError(f'--executor=gpu, but {reason}; use --executor=local '
                      'or inprocess.')


def _check_worker_isolation(config):
  """Refuses at once a local C++ worker this machine cannot isolate.

  `--executor=local` and `gpu` start TFF's worker, which serves every host
  that reaches it; it runs only in a network namespace of its own
  (`tff_clip.runtime.worker_isolation`). Asked here, before TensorFlow
  loads, not when the first computation would start the worker.
  """
  if config.executor not in ('local', 'gpu'):
    return
  from tff_clip.runtime import worker_isolation  # pylint: disable=g-import-not-at-top
  reason = worker_isolation.network_isolation_error()
  if reason is not None:
    raise ConfigError(worker_isolation.executor_refusal(
        config.executor, worker_isolation.refusal(reason)))


def _check_run_directory(config):
  """Refuses a run directory that cannot take this run (cheap: first)."""
  from tff_clip.program import run_directory  # pylint: disable=g-import-not-at-top
  from tff_clip.program import run_records  # pylint: disable=g-import-not-at-top
  try:
    status = run_directory.existing_run(config)  # Another run, a foreign dir.
  except run_records.RunRecordError:
    return  # Damaged records: `training.run` reads and names them (exit 1).
  if status != 'finished':  # A finished run is only reported.
    run_directory.check_writable(config)


def preflight(config: TrainConfig) -> None:
  """The checks of a run that need no data and no TensorFlow.

  After `validate`: the run directory (writable, free or this run's), the
  population where the task fixes it (`--clients_per_round`,
  minimum-separation groups, `--target_epsilon`), the remote workers'
  addresses and whether a local worker can be isolated. Whatever depends on data a task reads (natural clients) is
  checked once the task is built.
  """
  _check_run_directory(config)
  _check_population(config)
  _check_workers(config)
  _check_gpu(config)
  _check_worker_isolation(config)


# The tasks built last in this process, by their `get_task` arguments: the
# runs of a sweep or of the frontier's grid (one worker's trainings, one
# after another) ask for the same few. A `Task` is frozen, its data sets
# immutable and its `model_fn` makes a new model on every call, so runs can
# share one.
_TASKS = collections.OrderedDict()
_TASKS_KEPT = 2
# Dropped while the interpreter is whole: a task's data sets hold traced
# functions, whose finalizers print a TypeError once TensorFlow is torn down.
atexit.register(_TASKS.clear)


def build_task(config: TrainConfig):
  """The `tasks.get_task` task that `config`'s task flags name."""
  import tasks  # pylint: disable=g-import-not-at-top
  # The task's own shuffle is off: the training loop shuffles every client's
  # data with a seed of (seed, round, client), so a resumed run sees the
  # same order as an uninterrupted one.
  try:
    arguments = dict(
        data_source=config.data_source,
        num_clients=config.num_clients, partition=config.partition,
        partition_alpha=config.partition_alpha, seed=config.seed,
        train_batch_size=config.batch_size, local_epochs=config.local_epochs,
        shuffle_buffer_size=1, cache_dir=config.cache_dir,
        validation_fraction=config.validation_fraction,
        **dict(config.task_options))
    key = repr((config.task, sorted(arguments.items())))
    if key in _TASKS:
      _TASKS.move_to_end(key)
      return _TASKS[key]
    task = tasks.get_task(config.task, **arguments)
  except (TypeError, ValueError) as e:
    # Blamed on --task_option only where it names one of the options given
    # (a partition's error is the partition flags').
    if not any(key in str(e) for key, _ in config.task_options):
      raise
    raise ConfigError(f'--task_option (task {config.task!r}): {e}') from e
  _TASKS[key] = task
  while len(_TASKS) > _TASKS_KEPT:
    _TASKS.popitem(last=False)
  return task


def run(config: TrainConfig, quiet: bool = False, *, checked: bool = False):
  """Trains (or resumes, or reports) `config`'s run on its named task.

  `quiet`: nothing on stdout (the benchmarks run hundreds of trainings and
  print one line each); errors still raise. `checked`: the caller has run
  `validate` and `preflight` on `config` already (`scripts.train`), so a
  command validates its configuration once; else they run here.
  """
  if not checked:
    validate(config)
    preflight(config)
  from tff_clip.program import training  # pylint: disable=g-import-not-at-top
  if not quiet:
    return training.run(config, build_task, validated=True)
  with open(os.devnull, 'w') as devnull, contextlib.redirect_stdout(devnull):
    return training.run(config, build_task, validated=True)


def format_epsilon(epsilon) -> str:
  """Epsilon as printed: never 0 for a noisy mechanism (it is only small)."""
  from tff_clip.privacy import accountants  # pylint: disable=g-import-not-at-top
  return accountants.format_epsilon(epsilon)


def meaning_of_epsilon(epsilon, delta) -> str:
  """What the figure means: the odds bound of user-level (epsilon, delta)-DP."""
  if epsilon is None or not math.isfinite(epsilon):
    return 'Meaning: no guarantee.'
  if epsilon > 700.0:  # e^epsilon beyond float64: a void guarantee.
    return 'Meaning: no useful guarantee (e^epsilon exceeds 1e304).'
  odds = math.exp(epsilon)
  return ('Meaning: from everything this run released, no observer can '
          'raise its odds that a given client took part by more than a '
          f'factor e^epsilon = {odds:.3g}, except with probability {delta:g}.')


def format_summary(summary) -> str:
  """The end-of-run report of `training.run`'s summary."""
  lines = ['', f'== {summary["experiment"]} ==']
  if summary.get('final_objective') is not None:
    lines.append(f'final objective ({summary["objective_name"]}): '
                 f'{summary["final_objective"]:.6g}')
  if summary.get('final_eval_accuracy') is not None:
    lines.append(
        f'final eval accuracy: {summary["final_eval_accuracy"]:.4f}')
  elif summary.get('evaluation_withheld'):
    # A task that does not say its test data is no client's counts as one
    # whose data is (`program_logic.not_covered`).
    lines.append('final eval accuracy: withheld (the test data is, or may '
                 "be, the clients' own, which epsilon does not cover; "
                 '--release_uncovered_metrics releases it)')
  epsilon = summary['epsilon']
  private = summary.get('private', True)
  if summary['noise_multiplier'] is None:
    lines.append('privacy: none (no noise, no DP guarantee)')
  else:
    from tff_clip.privacy import accountants  # pylint: disable=g-import-not-at-top
    label = accountants.epsilon_label(
        epsilon, summary.get('accountant', 'rdp'), summary['delta'], private)
    lines.append(
        f'privacy: {label} '
        f'(z = {summary["noise_multiplier"]:.4g}, '
        f'{summary["clients_per_round"]} of {summary["population_size"]} '
        f'clients per round, {summary["sampling"]} sampling, '
        f'{summary["rounds"]} rounds); noise: {summary["noise"]}')
    if private:
      lines.append('  ' + meaning_of_epsilon(epsilon, summary['delta']))
    else:
      lines.append('  ' + summary.get('not_private', 'NOT private') +
                   ': it bounds no observer.')
    if summary.get('not_covered_by_epsilon'):
      lines.append('  NOT covered by epsilon (released on request): ' +
                   ', '.join(summary['not_covered_by_epsilon']))
    ext = summary.get('extrapolated')
    if ext:
      lines.append(
          '  The same noise on the average (z/n fixed) with '
          f'{ext["clients_per_round"]:,} of {ext["population_size"]:,} '
          f'clients per round would give ' + accountants.epsilon_label(
              ext['epsilon'], ext.get('accountant', 'rdp'), summary['delta'],
              private) +
          f' (z = {ext["noise_multiplier"]:.4g}, same rounds).')
  if summary.get('empirical_epsilon'):
    from tff_clip.privacy import audit  # pylint: disable=g-import-not-at-top
    lines.append(audit.format_report(summary['empirical_epsilon'], epsilon,
                                     summary.get('accountant')))
  return '\n'.join(lines)
