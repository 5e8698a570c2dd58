"""The training program behind `python -m scripts.train`: `run`.

Data flows one way, one call site per arrow: task (the caller's
`task_builder`; `scripts.program.build_task` for the `--task` names) ->
client work (`algorithms.build_fedavg`: local training, optional per-step
clipping, BLUR, LUS) -> bounding (`aggregators`) -> noise (`dp`) -> mean ->
server optimizer -> ledger (`privacy_ledger.PrivacyLedger`) and metrics.

`run` is the program along TFF's seam (TFF's `examples/program/`): the run
directory is checked (`run_directory`), the parts are assembled from the
configuration (`assembly`), and the round loop (`program_logic`) is handed
them with the run's state manager (`run_directory.RunState`) and its
release managers: `metrics.csv`, TensorBoard (`release_managers`) and any
the caller adds, every one behind the same release filter.

A run directory is a record, never silently changed. Everything is checked
(flags, task, sizes, DP feasibility, workers) before the first file is
written; a different configuration in an existing directory is refused; a
finished run is reported and left untouched; a killed run resumes from its
last checkpoint. What a round does depends on (seed, round number) and the
checkpointed state: the cohort (`sampling.ClientSampler`), the client data
order, and the DP noise, whose key is drawn from OS entropy and kept only in
the checkpointed aggregator state (or comes from `--noise_seed`, which makes
the run reproducible and NOT private).

What a DP run releases (`program_logic.RELEASED` / `NOT_COVERED`): the
model, epsilon, the clip norm (from the noised DP state) and evaluation on
server-held test data are covered by the ledger. The realised cohort size,
client training metrics, a synthetic task's objective and evaluation
(computed on the clients' data) and round timings are not: withheld unless
`release_uncovered_metrics`, and then listed in `summary.json` under
`not_covered_by_epsilon`. Rounds with an empty Poisson cohort run (noise
only), so the ledger counts what happened.

Outputs under `root_output_dir/experiment_name/` (docs/run_directory.md):
  config.json     the configuration (a rerun must match it to resume) and
                  what its defaults resolved to (`run_directory.RESOLVED_KEY`)
  releases.jsonl  the released rows and DP events, hash-chained (`run_records`)
  metrics.csv     the released rows, a view of releases.jsonl
  tensorboard/    the same rows (`release_managers.TensorBoardView`; under
                  DP its wall_time is the round number, not a time)
  checkpoints/    the state as flat arrays, naming the release they follow
  ledger.json     the DP events of every round and epsilon per round
  summary.json    final figures; plot.png: accuracy, loss, clip norm, epsilon

References:
* Yang, Qiu, Liu 2022: "Taming Fat-Tailed Noise in Federated Learning",
  NeurIPS 2022.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import sys
import time
from typing import Any, Callable, Sequence

from tff_clip import names
from tff_clip.names import MIN_SEPARATION
from tff_clip.privacy import accounting
from tff_clip.program import assembly
from tff_clip.program import config as config_lib
from tff_clip.program import preflight
from tff_clip.program import program_logic
from tff_clip.program import run_directory
from tff_clip.program import run_records
from tff_clip.program.config import ConfigError, TrainConfig, validate

__all__ = ['ConfigError', 'TaskBuilder', 'TrainConfig', 'run', 'validate']

# `task_builder(config) -> task` (see `run`).
TaskBuilder = Callable[[TrainConfig], Any]

# The honest-extrapolation point of the summary: a production-scale cohort.
EXTRAPOLATION_POPULATION = 1_000_000
EXTRAPOLATION_CLIENTS_PER_ROUND = 1_000


def run(config: TrainConfig, task_builder: TaskBuilder,
        release_managers: Sequence[Any] = (), *,
        validated: bool = False) -> dict[str, Any]:
  """Trains (or resumes, or reports a finished) run per `config`.

  Args:
    config: the run's configuration (`TrainConfig`).
    task_builder: `task_builder(config)` returns the task to train: a
      `tff.simulation.baselines.BaselineTask` (its `datasets.train_data`,
      `train_preprocess_fn`, `test_data`, `eval_preprocess_fn` and
      `model_fn`), optionally with `round_train_data(client_id, seed)` (data
      drawn afresh every round), `problem` (a synthetic objective) and
      `evaluates_on_clients_data` (False: its test data is no training
      client's, and a DP run releases its evaluation; without it, withheld
      as for `tasks.Task`s that say True). It is
      called only when the run trains and this process holds no session
      built from the same configuration and builder (`assembly.session`);
      a `ValueError` it raises is reported as a `ConfigError`.
      `scripts.train` passes `scripts.program.build_task` (the `--task`
      names of this repository's `tasks`).
    release_managers: more release destinations
      (`tff.program.ReleaseManager`s), each handed every row the run
      releases from here on, keyed by its round, behind the run's release
      filter (under DP, only what epsilon covers), after `releases.jsonl`,
      `metrics.csv` and TensorBoard.
    validated: True where the caller has passed `config` through `validate`
      already (`scripts.program.run`): a command validates it once.
  """
  if not validated:
    validate(config)
  out = config.output_dir
  status = found = run_directory.existing_run(config)
  if status != 'new' and config.private:
    run_directory.check_released(config)  # Nothing released is trained again.
  elif status != 'new':
    run_directory.check_no_dp_lost(config)  # No DP record is rewritten.
  if status == 'finished':
    recorded = run_directory.recorded_resolution(config)
    cohort = config.clients_per_round
    if cohort is None and recorded is not None:
      cohort = recorded.get('clients_per_round')  # As the population made it.
    if (recorded is not None and isinstance(recorded.get('dimension'), int)
        and isinstance(cohort, int)):
      # From the z, d and n it recorded: no model is built.
      run_directory.check_resolved(config, assembly.resolved_choices(
          dataclasses.replace(config, clients_per_round=cohort),
          recorded.get('noise_multiplier'), recorded['dimension']))
    summary = run_directory.finished_summary(config)
    if summary is not None:
      csv_path = os.path.join(out, 'metrics.csv')
      if run_records.repair_metrics_csv(
          csv_path, run_records.ReleaseLog(out).rows()):
        print(f'{csv_path} did not match {run_records.RELEASES}; it was '
              'rebuilt from it.', flush=True)
      else:
        print(f'{out}/ already holds this finished run (summary.json, '
              'metrics.csv, ledger.json); nothing was changed.', flush=True)
      return summary
    status = 'resume'
  run_directory.check_writable(config)
  if config.noise_seed is not None and config.private:
    print(f'WARNING: --noise_seed={config.noise_seed}: the DP noise is '
          'reproducible and predictable; this run is NOT private.',
          file=sys.stderr, flush=True)
  # Read-only checks of the records, then the session: all before a write.
  if status == 'resume':
    run_records.ReleaseLog(out)  # Damaged records are refused here.
  assembly.set_execution_context(config)
  session = assembly.session(config, task_builder)
  if status == 'resume':
    run_directory.check_resolved(config, session.resolved)
  # The first write: all checked. The directory, then its lock, then
  # config.json: one process trains a run at a time, and a start that
  # another start of the same run overtook while it built its session
  # (found new, now begun or finished) is refused, changing nothing.
  run_records.ensure_dir(out)
  with run_records.exclusive(out):
    if run_directory.existing_run(config) != found:
      raise ConfigError(
          f'{out!r}: another process started this run while this one '
          'prepared it; nothing was changed. Run the command again to '
          'resume or report it.')
    run_directory.prepare_output_dir(config, session.resolved)
    # The records are read again under the lock. Recorded as given (a rerun
    # of the same flags resumes it); trained with the cohort the population
    # resolves (a separated run's smallest group).
    return _train(preflight.with_population(config, session.population),
                  session,
                  run_records.ReleaseLog(out),
                  status == 'resume', release_managers)


def _train(config, session, log, resuming, extra_release_managers):
  """The rounds of `config` from where its records stop; the summary."""
  from tff_clip.program import release_managers  # pylint: disable=g-import-not-at-top
  out = config.output_dir
  state_manager = run_directory.RunState(
      config, log, session.private, session.state_leaves,
      session.state_from_leaves, session.model_layout, session.client_ids)
  restored = state_manager.restore(session.initial_state)
  ledger = run_directory.ledger_of(log)
  views = [release_managers.MetricsCsvView(
               log, os.path.join(out, 'metrics.csv'), resuming),
           release_managers.TensorBoardView(
               os.path.join(out, 'tensorboard'), log, resuming,
               # Under DP no clock: the round number as wall time.
               clock=None if session.private else lambda step: time.time())]
  released = program_logic.released_metric(
      session.private, config.release_uncovered_metrics,
      program_logic.not_covered(session.task))
  accounting_ = (program_logic.Accounting(
      session.round_event, ledger, config.delta,
      private=config.noise_seed is None) if session.private else None)
  progress = _Progress(config, restored[1], released, accounting_)
  if config.plot:
    from tff_clip.program import plotting  # pylint: disable=g-import-not-at-top
    plotting.import_in_background()  # Ready for the plot when the rounds end.
  state = program_logic.train_model(
      process=session.process,
      sampler=session.sampler.keyed(state_manager.sampling_key),
      client_data=session.client_datasets, evaluate=session.evaluate,
      state_manager=state_manager,
      release_managers=views + list(extra_release_managers),
      schedule=program_logic.Schedule(
          config.rounds, config.eval_every, config.checkpoint_every,
          config.checkpoint_interval_s),
      restored=restored,
      accounting=accounting_,
      objective=session.objective, released=released, progress=progress,
      # The last evaluation released, the pending rounds' included.
      last_eval=run_directory.last_eval(
          log.rows() + [row for _, row, _ in restored[2] or ()]))
  progress.close()
  return _finish(config, session, ledger, log, session.audit_report(state))


class _Progress:
  """A tqdm bar, or one line per round; shows only what a round releases.

  `released(path)` is the run's release filter (`released_metric`): under
  DP the clients' training loss and the round's seconds (which grow with
  the cohort) are withheld, so the bar shows neither them nor tqdm's rate
  and times.
  """

  def __init__(self, config, start_round, released, accounting_=None):
    self._config = config
    self._released = released
    self._accounting = accounting_  # The epsilon shown: its label.
    self._bar = None
    if config.progress:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      timings = released(('seconds',))
      self._bar = tqdm(
          total=config.rounds, initial=start_round - 1,
          desc=config.experiment_name, unit='round',
          bar_format=None if timings else
          '{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}')

  def update(self, round_num, row, last_eval, guarantee=None):
    shown = collections.OrderedDict()
    for key, label in (('train_loss', 'loss'), ('objective', 'objective'),
                       ('clip_norm', 'clip')):
      if key in row and self._released((key,)):
        shown[label] = row[key]
    if 'eval_accuracy' in last_eval and self._released(('eval_accuracy',)):
      shown['acc'] = last_eval['eval_accuracy']  # From its first evaluation.
    # The row's epsilon, its accountant and delta named (NOT private with
    # seeded noise), as metrics.csv, TensorBoard and the summary show it.
    epsilon = ('' if guarantee is None or self._accounting is None else
               guarantee.label(self._accounting.private))
    if self._bar is None:
      print(f'round {round_num}/{self._config.rounds} ' + ' '.join(
          [f'{k}={v:.4g}' for k, v in shown.items()] +
          ([epsilon] if epsilon else [])), flush=True)
    else:
      self._bar.update(1)
      postfix = collections.OrderedDict(
          (k, f'{v:.3g}') for k, v in shown.items())
      if epsilon:
        postfix['eps'] = epsilon[len('epsilon '):]
      self._bar.set_postfix(postfix)

  def close(self):
    if self._bar is not None:
      self._bar.close()


def _noise_label(config, session):
  if not session.private:
    return 'none'
  mechanism = (f'{config.noise_mechanism} (b = {config.bands}) correlated '
               'across rounds; ' if config.noise.correlated else '')
  baseline = config_lib.baseline(config)
  if baseline is not None and not baseline.seeded:
    return mechanism + ("TFF's own generator (not checked for secrecy by "
                        'tff_clip)')
  if config.noise_seed is not None:
    return mechanism + (f'reproducible from --noise_seed={config.noise_seed}'
                        ': predictable, NOT private')
  return mechanism + 'secret (OS entropy; the key is kept only in checkpoints/)'


def _ledger_report(ledger, config, session, log):
  report = {'delta': config.delta, 'noise_multiplier': session.noise_multiplier,
            'sampling': config.sampling,
            'noise': _noise_label(config, session),
            'ledger': ledger.to_dict()}
  if config.noise_seed is not None:
    report['private'] = False
    report['not_private'] = _NOT_PRIVATE
  if len(ledger):  # Each round's epsilon, as released in its row.
    columns = [(r['round'], next((k, v) for k, v in r['row'].items()
                                 if names.is_epsilon_key(k)))
               for r in log.records if r['event'] is not None]
    # Named by its column: PLD's figures, then RDP's past PLD's grid
    # (`accounting.report_epsilon`) are each named by their own accountant.
    by_round = [_column_accountant(key) for _, (key, _) in columns]
    report['epsilon_per_round_accountant'] = (
        by_round[0] if len(set(by_round)) == 1 else by_round)
    report['epsilon_per_round'] = [[r, v] for r, (_, v) in columns]
  return report


def _column_accountant(key: str) -> str:
  """'pld' of the column 'epsilon_pld_delta_1e-05' (`names.epsilon_key`)."""
  rest = key[len(names.EPSILON) + 1:]
  if rest.startswith('NOT_PRIVATE_'):
    rest = rest[len('NOT_PRIVATE_'):]
  return rest.partition('_delta_')[0]


# What a --noise_seed run says wherever it shows epsilon.
_NOT_PRIVATE = ('NOT private: the noise is reproducible from --noise_seed, '
                'so epsilon guarantees nothing')


def _finish(config, session, ledger, log, audit_report=None):
  out = config.output_dir
  rows = log.rows()
  summary = _summary(config, session, ledger, run_directory.last_eval(rows),
                     rows[-1] if rows else {})
  if audit_report is not None:
    summary['empirical_epsilon'] = audit_report
  run_records.write_json(os.path.join(out, 'ledger.json'),
             _ledger_report(ledger, config, session, log))
  if config.plot:
    from tff_clip.program import plotting  # pylint: disable=g-import-not-at-top
    plotting.plot_metrics(os.path.join(out, 'metrics.csv'),
                          os.path.join(out, 'plot.png'),
                          title=config.experiment_name)
  # Last: its presence marks the run finished.
  run_records.write_json(os.path.join(out, 'summary.json'), summary)
  return run_records.strict_json(summary)


def _summary(config, session, ledger, last_eval, last_row):
  z = session.noise_multiplier
  summary = collections.OrderedDict(
      experiment=config.experiment_name, task=config.task,
      rounds=config.rounds, population_size=session.population,
      clients_per_round=config.clients_per_round, sampling=config.sampling,
      noise_multiplier=z, delta=config.delta,
      noise=_noise_label(config, session),
      final_eval_accuracy=last_eval.get('eval_accuracy', math.nan),
      final_eval_loss=last_eval.get('eval_loss', math.nan))
  # As resolved (--bounding=noise_following: chosen from the noise).
  summary['bounding'] = session.bounding
  if session.target_quantile is not None:
    # As resolved (--target_quantile unset: it follows the noise).
    summary['target_quantile'] = session.target_quantile
  if session.resolved.get('quantile_switch') and 'target_quantile' in last_row:
    # Where it could move (`noise_following.QuantileSwitch`): where it ended.
    summary['final_target_quantile'] = last_row['target_quantile']
  # As resolved (--server_step=auto: damped in DP runs of tff_clip's
  # boundings with independent noise).
  summary['server_step'] = session.server_step
  if 'objective' in last_row:
    # The synthetic problems' measure of progress (f(w) - f(w*), ||x||^2).
    summary['objective_name'] = session.task.problem.report_name
    summary['final_objective'] = last_row['objective']
  if session.private:
    summary.update(run_directory.epsilons(ledger, config.delta))  # 0: none.
    summary['epsilon_label'] = ledger.report(config.delta).label(
        config.noise_seed is None)
    if config.noise_seed is not None:
      summary['private'] = False
      summary['not_private'] = _NOT_PRIVATE
    released = [k for k in program_logic.not_covered(session.task)
                if k in last_row]
    if released:
      summary['not_covered_by_epsilon'] = released
    # Evaluated on the clients' own data, and not released: say so.
    summary['evaluation_withheld'] = not config.release_uncovered_metrics and (
        program_logic.EVALUATION[0] in program_logic.not_covered(session.task))
    if z > 0 and config.sampling != MIN_SEPARATION:
      # Same noise on the average (z / n fixed) at production scale.
      scaled_z = (z / config.clients_per_round *
                  EXTRAPOLATION_CLIENTS_PER_ROUND)
      extrapolated = accounting.report_epsilon(accounting.training_event(
          scaled_z, clients_per_round=EXTRAPOLATION_CLIENTS_PER_ROUND,
          population_size=EXTRAPOLATION_POPULATION, rounds=config.rounds,
          sampling=config.sampling), config.delta)
      summary['extrapolated'] = collections.OrderedDict(
          population_size=EXTRAPOLATION_POPULATION,
          clients_per_round=EXTRAPOLATION_CLIENTS_PER_ROUND,
          noise_multiplier=scaled_z, epsilon=extrapolated.epsilon,
          accountant=extrapolated.accountant)
  else:
    summary['epsilon'] = None  # No DP: no guarantee.
  return summary
