"""The run directory's lifecycle: is there a run, may it go on, what it spent.

A run directory (`root_output_dir/experiment_name/`, docs/run_directory.md)
is a record, never silently changed, that only its owner controls. Before
anything is read, `check_location` refuses a run directory another user
could change (`run_records.check_location`: owned by another user, or
writable by others, it or any directory above it). Before anything is
built or written, `existing_run` says whether `config` starts, resumes or
is finished there (refusing another configuration or a foreign directory),
`check_writable` whether this process can create it, and `check_released`
whether a DP run's surviving files prove releases that its log
(`releases.jsonl`) lost, which must never be trained again, and
`check_no_dp_lost` whether a run without DP would rewrite the records of
DP rounds. A finished
run's report is `finished_summary`, recomputed from its records. A run
that trains keeps its state in `RunState`: checkpoints that name the
release they follow, and the log of released rounds.

None of this imports TensorFlow, and the location checks do not import
dp_accounting either (about half a second): a bad `--root_output_dir` is
refused in a fraction of a second. The records themselves (atomic files,
the hash-chained log, checkpoints, the lock) are `tff_clip.program.run_records`.
"""

from __future__ import annotations

import collections
import math
import os
import secrets
import sys
import tempfile
from typing import Any, Optional

from tff_clip.names import MIN_SEPARATION
from tff_clip.privacy import sampling as sampling_lib
from tff_clip.program import release_evidence
from tff_clip.program import checkpoints
from tff_clip.program import run_records
from tff_clip.program.config import ConfigError, TrainConfig
from tff_clip.program.config import EXECUTION_KEYS, LEGACY_DEFAULTS
from tff_clip.program.config import NO_BOUNDING, RENAMED_KEYS

__all__ = [
    'RECORD_KEYS', 'RESOLVED_KEY', 'RUN_ID_KEY', 'RunState', 'check_location', 'check_no_dp_lost',
    'check_released', 'check_resolved', 'check_writable', 'epsilons',
    'existing_run', 'finished_summary', 'last_eval', 'ledger_of',
    'prepare_output_dir', 'recorded_resolution', 'refusal',
]

# config.json's entry for what the run's defaults resolved to when it
# started (`assembly.resolved_choices`: bounding, target quantile, server
# step, the client groups of minimum separation, and the noise multiplier
# and model size they were read from). Not part of the configuration: a
# record of what this tff_clip made of it.
RESOLVED_KEY = 'resolved'
# config.json's random name of the run, drawn when it starts and kept in each
# of its checkpoints: another run's checkpoint (copied in, or left behind) is
# refused even before the run's first release, when the log cannot tell.
RUN_ID_KEY = 'run_id'
RECORD_KEYS = (RESOLVED_KEY, RUN_ID_KEY)  # Records, not configuration.
_CHOICES = ('bounding', 'target_quantile', 'quantile_switch', 'server_step',
            'client_groups', 'noise_factorization')


def _nearest_existing(path: str) -> str:
  parent = os.path.abspath(path)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  return parent


def _reads_quantile(fields: dict) -> bool:
  """Whether a run of these config fields tracks a target quantile."""
  return (fields.get('clip_norm') == 'adaptive' and
          fields.get('bounding') != NO_BOUNDING)


def check_location(config: TrainConfig) -> None:
  """Refuses a run directory that another user could change, before
  anything in it is read: `ConfigError` naming `--root_output_dir`, the
  directory and its owner or mode (`run_records.check_location`)."""
  try:
    run_records.check_location(config.output_dir)
  except run_records.LocationError as e:
    raise ConfigError(str(e)) from None


def existing_run(config: TrainConfig) -> str:
  """'new', 'resume' or 'finished' for `config.output_dir`; writes nothing.

  Raises `ConfigError` when the directory (or one above it) is another
  user's to change (`check_location`, asked first), holds another
  configuration or something else, or cannot be created, and
  `run_records.RunRecordError` when its config.json cannot be read.
  """
  check_location(config)
  out = config.output_dir
  if not os.path.exists(out):
    parent = _nearest_existing(out)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
      raise ConfigError(f'--root_output_dir: cannot create {out!r} ({parent!r} '
                        'is not a writable directory).')
    return 'new'
  if not os.path.isdir(out) or not os.access(out, os.W_OK):
    raise ConfigError(f'--root_output_dir: {out!r} is not a writable '
                      'directory.')
  config_path = os.path.join(out, 'config.json')
  if not os.path.lexists(config_path):
    # What a kill at the first write leaves (the run's lock, config.json's
    # temporary file, `check_writable`'s probe) is no other run's.
    if [n for n in os.listdir(out) if n not in (
        run_records.LOCK, '.config.json.tmp') and not n.startswith(_PROBE)]:
      raise ConfigError(
          f'{out!r} is not empty and holds no tff_clip run; nothing was '
          'changed. Choose another --experiment_name or --root_output_dir.')
    return 'new'
  recorded = run_records.read_json(config_path, 'run configuration')
  if not isinstance(recorded, dict):
    raise run_records.RunRecordError(
        f'{config_path} is not a run configuration (damaged).')
  previous = {RENAMED_KEYS.get(k, k): v for k, v in recorded.items()
              if k not in EXECUTION_KEYS + RECORD_KEYS}
  current = config.identity()
  # A run recorded before a knob existed ran with that knob's default.
  defaults = TrainConfig().identity()
  previous = {**{k: LEGACY_DEFAULTS.get(k, defaults[k])
                 for k in current if k not in previous},
              **previous}
  if not any(_reads_quantile(fields) for fields in (previous, current)):
    # No adaptive norm: the target quantile plays no part (and its recorded
    # default was 0.3 before it followed the noise).
    for fields in (previous, current):
      fields.pop('target_quantile', None)
  if previous != current:
    changed = sorted(k for k in set(previous) | set(current)
                     if previous.get(k) != current.get(k))
    was_private = (previous.get('noise_multiplier') is not None or
                   previous.get('target_epsilon') is not None)
    raise ConfigError(
        f'{out!r} holds a run with a different configuration (differs in: '
        f'{", ".join(changed)}); nothing was changed. Choose another '
        '--experiment_name or --root_output_dir' + (
            ' (that directory is the record of a DP run: deleting it does '
            'not take back what it released).' if was_private else
            ', or delete that directory.'))
  if os.path.lexists(os.path.join(out, 'summary.json')):
    return 'finished'
  return 'resume'


_PROBE = '.tff_clip_probe_'


def check_writable(config: TrainConfig) -> None:
  """Refuses an output directory this process cannot create or write in.

  Asked of the file system, not of permission bits (`os.access` answers
  yes to root, and knows nothing of read-only or pseudo file systems): a
  directory is made and removed at once in the run directory, or where it
  would be created. `ConfigError` naming `--root_output_dir` and the reason.
  """
  check_location(config)
  out = config.output_dir
  where = out if os.path.isdir(out) else _nearest_existing(out)
  if not os.path.isdir(where):
    raise ConfigError(f'--root_output_dir: cannot create {out!r} ({where!r} '
                      'is not a directory).')
  try:
    os.rmdir(tempfile.mkdtemp(prefix=_PROBE, dir=where))
  except OSError as e:
    raise ConfigError(f'--root_output_dir: cannot write in {where!r} '
                      f'({e.strerror}).') from None


def prepare_output_dir(config: TrainConfig,
                       resolved: Optional[dict] = None) -> bool:
  """Creates the directory and config.json (with `resolved` under
  `RESOLVED_KEY`); True when a run can resume there."""
  status = existing_run(config)
  # Each directory made writable by its owner only, then checked again:
  # one another user made meanwhile (in a sticky /tmp) is refused.
  run_records.ensure_dir(config.output_dir)
  if status == 'new':
    recorded = config.to_json()
    if resolved is not None:
      recorded[RESOLVED_KEY] = dict(resolved)
    recorded[RUN_ID_KEY] = secrets.token_hex(16)
    run_records.write_json(os.path.join(config.output_dir, 'config.json'),
                           recorded)
  return status != 'new'


def _recorded(config: TrainConfig, key: str, kind: type):
  """config.json's `key` in `config.output_dir`, where it is a `kind`; None
  for a run recorded before runs kept it, or no run."""
  path = os.path.join(config.output_dir, 'config.json')
  if not os.path.lexists(path):
    return None
  recorded = run_records.read_json(path, 'run configuration')
  value = recorded.get(key) if isinstance(recorded, dict) else None
  return value if isinstance(value, kind) else None


def recorded_resolution(config: TrainConfig) -> Optional[dict]:
  """What the run in `config.output_dir` resolved its defaults to when it
  started (config.json's `RESOLVED_KEY`); None for a run recorded before
  runs kept it, or no run."""
  return _recorded(config, RESOLVED_KEY, dict)


def check_resolved(config: TrainConfig, current: dict) -> None:
  """Refuses to resume or report a run whose defaults this tff_clip resolves
  otherwise than when it started (its bounding, target quantile, server
  step, client groups of --sampling=min_separation, BLT parameters), which
  would mix two configurations in one run or report one as the other.
  `ConfigError` naming both; nothing is changed. A run that did not record
  them is let through, but under minimum separation (hashed groups then;
  resumed with others, a client could take part twice within b rounds)."""
  recorded = recorded_resolution(config)
  if recorded is None:
    if config.sampling == MIN_SEPARATION:
      raise ConfigError(
          f'{config.output_dir!r} holds a --sampling=min_separation run '
          'recorded before runs kept their client groups (its groups were a '
          'hash of seed and client id, of unequal sizes); this tff_clip groups'
          f' clients as {current.get("client_groups")!r}: going on would '
          'change the groups mid-way and break the separation (nothing was '
          'changed). Choose another --experiment_name or --root_output_dir.')
    return
  differs = [k for k in _CHOICES if not _same(recorded.get(k),
                                              current.get(k)) and (
      k in recorded or k != 'noise_factorization')]  # Not in older records.
  if differs:
    was = ', '.join(f'{k}={recorded.get(k)!r}' for k in differs)
    now = ', '.join(f'{k}={current.get(k)!r}' for k in differs)
    raise ConfigError(
        f'{config.output_dir!r} holds a run whose defaults resolved to {was} '
        f'when it started; this tff_clip resolves them to {now}: going on '
        'would mix the two (nothing was changed). Choose another '
        '--experiment_name or --root_output_dir.')


# ----------------------------------------------------------------------------
# What the records prove was released and spent (dp_accounting from here on).


def ledger_of(log: run_records.ReleaseLog):
  """The DP events of the released rounds (what epsilon must count)."""
  from tff_clip.privacy import privacy_ledger  # pylint: disable=g-import-not-at-top
  ledger = privacy_ledger.PrivacyLedger()
  for round_num, event in log.events():
    if event is not None:
      ledger.record(round_num, privacy_ledger.event_from_dict(event))
  return ledger


def epsilons(ledger, delta) -> dict[str, Any]:
  """The run's one epsilon: {'epsilon', 'accountant'} (`ledger.report`:
  PLD wherever it can account for the events, RDP otherwise), the figure
  every round's row and the end-of-run line show."""
  guarantee = ledger.report(delta)
  return collections.OrderedDict(epsilon=guarantee.epsilon,
                                 accountant=guarantee.accountant)


def last_eval(rows):
  """The last released evaluation (loss, accuracy), NaN when none."""
  for row in reversed(rows):
    if math.isfinite(row.get('eval_accuracy', math.nan)) or math.isfinite(
        row.get('eval_loss', math.nan)):
      return collections.OrderedDict(
          eval_loss=row.get('eval_loss', math.nan),
          eval_accuracy=row.get('eval_accuracy', math.nan))
  return collections.OrderedDict(eval_loss=math.nan, eval_accuracy=math.nan)


def finished_summary(config: TrainConfig):
  """A finished run's summary.json, if it agrees with the run's records.

  summary.json is a report, never the truth: its epsilon and final figures
  are recomputed from `releases.jsonl`. None (after saying why) when it
  is damaged or disagrees: the caller then rebuilds it from the records.
  """
  out = config.output_dir
  path = os.path.join(out, 'summary.json')
  try:
    stored = run_records.read_json(path, 'summary')
    if not isinstance(stored, dict):
      raise run_records.RunRecordError(f'{path} is not a summary (damaged).')
  except run_records.RunRecordError as e:
    print(f'{e} It is rebuilt from the run\'s records.', flush=True)
    return None
  log = run_records.ReleaseLog(out)
  ledger = ledger_of(log)
  final = last_eval(log.rows())
  expected = dict(
      rounds=log.last_round,
      epsilon=(epsilons(ledger, config.delta)['epsilon'] if len(ledger)
               else None),
      final_eval_accuracy=final['eval_accuracy'],
      final_eval_loss=final['eval_loss'])
  expected = run_records.strict_json(expected)
  expected['rounds'] = config.rounds if log.last_round == config.rounds else (
      f'{log.last_round} released')
  differs = [k for k, v in expected.items() if not _same(stored.get(k), v)]
  if differs:
    print(f'{path} does not match the run\'s records ({", ".join(differs)}); '
          'it is rebuilt from them.', flush=True)
    return None
  return stored


def _same(a, b) -> bool:
  if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not (
      isinstance(a, bool) or isinstance(b, bool)):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
  return a == b


def _proven_spent(config, log, evidence):
  """(rounds, epsilon, its accountant): the most that `releases.jsonl` or
  any other surviving file proves was released, and spent.

  Rounds beyond the log's are charged the round event a checkpoint, the log
  or `ledger.json` recorded (under minimum separation, one participation per
  cycle of b rounds, as `accounting.min_separation_round_event`); the
  epsilon is the larger of that composition, by the accountant the run
  reports with (`PrivacyLedger.report`), and any epsilon a file recorded
  (the run's own figure). The accountant is None where no event survives.
  """
  from tff_clip.privacy import accounting  # pylint: disable=g-import-not-at-top
  from tff_clip.privacy import privacy_ledger  # pylint: disable=g-import-not-at-top
  ledger = ledger_of(log)
  rounds = max(log.last_round, evidence.rounds)
  template = next((e for _, e in log.events()
                   if e is not None and e.get('type') != 'NoOpDpEvent'),
                  evidence.event)
  if template is not None:
    template = privacy_ledger.event_from_dict(template)
    for round_num in range(log.last_round + 1, rounds + 1):
      event = template
      if config.sampling == MIN_SEPARATION:
        event = accounting.min_separation_round_event(
            template, round_num - 1, config.separation)
      ledger.record(round_num, event)
  spent = [e for e in (evidence.epsilon,) if e is not None]
  accountant = None
  if len(ledger):
    report = ledger.report(config.delta)
    spent.append(report.epsilon)
    accountant = report.accountant
  return rounds, max(spent) if spent else None, accountant


def _spent(log, config, evidence=None) -> str:
  evidence = evidence or release_evidence.release_evidence(config.output_dir)
  rounds, epsilon, accountant = _proven_spent(config, log, evidence)
  if not rounds:
    return ''
  by = '' if accountant is None else f' ({accountant.upper()})'
  spent = ('an epsilon no surviving file records' if epsilon is None else
           f'epsilon = {epsilon:.4g}{by} at delta = {config.delta:g}')
  return (f' The {rounds} rounds released so far spent {spent} (at least: '
          'the most that the surviving files prove).')


def refusal(config, log, what, evidence=None) -> run_records.RunRecordError:
  """The error that stops a DP run whose records cannot be trusted: `what`
  happened, and what the surviving files prove was spent."""
  return run_records.RunRecordError(
      f'{config.output_dir}: {what}; continuing would compute released '
      'rounds again under the same or a new noise key, so the run stops here '
      f'and nothing was changed.{_spent(log, config, evidence)}')


def check_released(config: TrainConfig) -> None:
  """Refuses a DP run whose files prove releases its log does not list.

  A DP run directory whose `releases.jsonl` was deleted, emptied or cut
  short while other files (`metrics.csv`, `tensorboard/`, `summary.json`,
  `ledger.json`, `plot.png`, a checkpoint) show that rounds were released
  must never train those rounds again: they would be released a second
  time under a new noise key, and the privacy cost would add up.
  """
  log = run_records.ReleaseLog(config.output_dir)
  evidence = release_evidence.release_evidence(config.output_dir)
  covered = log.last_round
  # Rounds checkpointed (with their rows) but cut from the log by a kill are
  # released again from their checkpoint: the same rows, never computed
  # again.
  store = checkpoints.Checkpoints(
      os.path.join(config.output_dir, 'checkpoints'))
  for version in reversed([v for v in store.versions() if v > covered]):
    try:
      _, header = store.load(version)
    except run_records.UnsafeFileError:
      raise
    except run_records.RunRecordError:
      continue
    pending = checkpoints.pending_rounds(header, version)
    if pending and pending[0][0] - 1 <= covered and header.get(
        'log_hash') == log.hash_at(pending[0][0] - 1):
      covered = version
      break
  if evidence.rounds > covered:
    listed = (f'lists only rounds 1-{log.last_round}' if log.last_round else
              'lists none')
    raise refusal(config, log, f'{evidence.proof} shows that rounds up to '
                  f'{evidence.rounds} were released but '
                  f'{run_records.RELEASES} {listed}', evidence)


def check_no_dp_lost(config: TrainConfig) -> None:
  """Refuses a run without DP in a directory whose files prove DP rounds.

  Its records say the run has no DP (config.json's `noise_multiplier` is
  null, perhaps edited so), yet `releases.jsonl` holds a DP event, or
  another surviving file (`metrics.csv`'s or TensorBoard's epsilon,
  `ledger.json`, `summary.json`, a checkpoint's pending event) proves a DP
  round was released. Going on would train and release those rounds again
  without noise and rewrite their records with no epsilon, erasing what
  they spent: refused like any other loss of records, before anything is
  written.
  """
  log = run_records.ReleaseLog(config.output_dir)
  proof = next((log.path for _, event in log.events() if event is not None),
               '')
  evidence = release_evidence.release_evidence(config.output_dir)
  proof = proof or evidence.dp_proof
  if proof:
    raise refusal(config, log, f'{proof} shows that DP rounds were released, '
                  'but this run has no DP (config.json and the flags say '
                  'noise_multiplier is none): it would release them again '
                  'without noise and rewrite their records with no epsilon',
                  evidence)


# ----------------------------------------------------------------------------
# The run's program state: checkpoints, each naming the release it follows.


class RunState:
  """The state manager of a run: its checkpoints and its release log.

  The role of TFF's `tff.program.ProgramStateManager`, for a run whose
  releases must never be computed twice: a checkpoint
  (`checkpoints/round_NNNNNN.npz`, readable by its owner only: it holds the
  noise key) records the `releases.jsonl` hash of the last round it covers,
  and a DP round's checkpoint also the row and event its release will
  show. `restore` trusts a checkpoint only together with the log; `record`
  appends a released round to the log.

  `to_leaves(state)` and `from_leaves(leaves)` turn the state into the flat
  arrays a checkpoint holds and back; `model_layout` says where the model's
  weights lie among them (`checkpoints.share`).
  """

  def __init__(self, config: TrainConfig, log: run_records.ReleaseLog,
               private: bool, to_leaves, from_leaves,
               model_layout: Optional[dict[str, int]], client_ids=()):
    self._config = config
    self._log = log
    self._private = private
    self._to_leaves = to_leaves
    self._from_leaves = from_leaves
    self._model = model_layout
    self._checkpoints = checkpoints.Checkpoints(
        os.path.join(config.output_dir, 'checkpoints'))
    # The secret key a private Poisson/fixed-size run draws its cohorts from
    # (`ClientSampler.keyed`), set by `restore` (None: from --seed).
    self._secret_sampling = (
        private and config.noise_seed is None and
        config.sampling in (sampling_lib.POISSON, sampling_lib.FIXED_SIZE))
    self.sampling_key = None
    self._run_id = _recorded(config, RUN_ID_KEY, str)  # None: an older run.
    # Hash of the ids min. separation groups; in checkpoints only (clients').
    self._ids = (sampling_lib.id_set_fingerprint(client_ids)
                 if config.sampling == MIN_SEPARATION else None)

  def restore(self, initial_state):
    """(state, first round to train, pending [(round, row, event), ...]).

    `initial_state()` when nothing was trained. A DP run whose released
    rounds no loadable checkpoint covers is refused (it would release them
    again), as is a log that lost rounds a checkpoint covers; a run without
    DP trains the rounds after its checkpoint again.
    """
    config, log = self._config, self._log
    released = log.last_round
    found = self._checkpoints.load_latest(
        warn=lambda message: print(message, file=sys.stderr, flush=True))
    if found is None:
      if released == 0:
        self._checkpoints.tidy()
        if self._secret_sampling:
          self.sampling_key = sampling_lib.new_sampling_key()
        return initial_state(), 1, []
      if self._private:
        raise refusal(config, log, f'rounds 1-{released} were released '
                      f'({run_records.RELEASES}) but no loadable checkpoint '
                      'covers them (checkpoints/ is missing or damaged)')
      print(f'No loadable checkpoint: rounds 1-{released} run again (no '
            'DP).', flush=True)
      self._checkpoints.tidy()
      log.truncate(0)
      return initial_state(), 1, []
    version, leaves, header = found
    if header.get('run_id') != self._run_id:
      raise refusal(config, log, f'the checkpoint of round {version} is '
                    'another run\'s (its run_id is not config.json\'s): it '
                    'holds that run\'s noise key')
    if header.get('client_ids', self._ids) != self._ids:
      raise ConfigError(
          f'{config.output_dir!r}: the run\'s groups were dealt from other '
          "client ids than the task's now; dealt anew, a client could take "
          'part twice within --min_separation rounds (nothing was changed).')
    # Kept with the state: the resumed rounds draw the cohorts they would
    # have (a checkpoint of a run that drew them from --seed has none).
    self.sampling_key = header.get('sampling_key')
    if self._secret_sampling and self.sampling_key is None:
      # Saved by a tff_clip that drew a private run's cohorts from --seed:
      # from here on they are secret, as the accounting assumes.
      self.sampling_key = sampling_lib.new_sampling_key()
      print(f'WARNING: the checkpoint of round {version} holds no sampling '
            f'key: rounds 1-{version} drew their cohorts from --seed, which '
            'the epsilon of their sampling assumes secret; the rounds from '
            'here on draw them in secret.', file=sys.stderr, flush=True)
    pending = checkpoints.pending_rounds(header, version)
    base = pending[0][0] - 1 if pending else version
    if released > version:
      if self._private:
        raise refusal(config, log, f'rounds {version + 1}-{released} were '
                      f'released ({run_records.RELEASES}) but the newest '
                      f'loadable checkpoint is of round {version}')
      print(f'Rounds {version + 1}-{released} run again from the checkpoint '
            f'of round {version} (no DP).', flush=True)
      log.truncate(version)
      released = version
    if released < base:
      raise refusal(config, log, f'the checkpoint of round {version} covers '
                    f'rounds up to {base} but {run_records.RELEASES} lists '
                    f'only {released}: the records of rounds '
                    f'{released + 1}-{base} are lost')
    if log.hash_at(min(released, base)) != header.get('log_hash'):
      raise refusal(config, log, f'the checkpoint of round {version} does '
                    f'not belong to {run_records.RELEASES} (the log hashes '
                    'differ)')
    state = self._from_leaves(leaves)
    from tff_clip.privacy import privacy_ledger  # pylint: disable=g-import-not-at-top
    # The rounds checkpointed but not (all) released: released from here.
    pending = [(round_num, {k: math.nan if v is None else v
                            for k, v in row.items()},
                privacy_ledger.event_from_dict(event))
               for round_num, row, event in pending if round_num > released]
    # Decided: what a killed save left goes (a refusal changed nothing).
    self._checkpoints.tidy()
    print(f'Resuming {config.output_dir}/ from its checkpoint after round '
          f'{version} of {config.rounds}.', flush=True)
    return state, version + 1, pending

  def checkpoint(self, round_num: int, state, pending=()) -> None:
    """Saves round `round_num`'s state.

    `pending`: [(round, row, event), ...] of the DP rounds up to
    `round_num` saved before their release, oldest first; the checkpoint
    then follows the log of the rounds before them.
    """
    if not pending:
      header = dict(pending=None, log_hash=self._log.hash_at(round_num),
                    model=self._model)
    else:
      header = dict(pending=[dict(round=r, row=run_records.strict_json(row),
                                  event=_event_dict(event))
                             for r, row, event in pending],
                    log_hash=self._log.hash_at(pending[0][0] - 1),
                    model=self._model)
    if self.sampling_key is not None:  # Server-private, as the noise key.
      header['sampling_key'] = self.sampling_key
    if self._run_id is not None:
      header['run_id'] = self._run_id
    if self._ids is not None:
      header['client_ids'] = self._ids
    self._checkpoints.save(round_num, self._to_leaves(state), header)

  def record(self, round_num: int, row, event) -> None:
    """Appends the released round (its row and DP event) to the log,
    durable at the next `sync` (a release of many rounds syncs once)."""
    self._log.append(round_num, row, _event_dict(event), sync=False)

  def sync(self) -> None:
    """Makes the rounds recorded so far durable."""
    self._log.sync()


def _event_dict(event):
  if event is None:
    return None
  from tff_clip.privacy import privacy_ledger  # pylint: disable=g-import-not-at-top
  return privacy_ledger.event_to_dict(event)
