"""What a training run is: `TrainConfig`, declared once, and its validation.

Every field carries its flag's help text, so `scripts.train` generates its
flags from this declaration (a new knob is added here, and only here). The
DP fields are declared once, in `tff_clip.aggregation.spec.DPSpec` (their names,
defaults and help, shared with `tff_clip.aggregation.dp.dp_factory`); `dp_spec` turns a
configuration into that spec. Validation needs no TensorFlow: a bad flag is
reported in well under two seconds, before anything is imported or written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import typing
from typing import Any, Optional, Union

import numpy as np

from tff_clip import checks
from tff_clip import names
from tff_clip.aggregation import mechanisms
from tff_clip.aggregation import noise_following
from tff_clip.aggregation import spec
from tff_clip.aggregation.baselines import BASELINES, NO_BOUNDING, TFF_GAUSSIAN, TFF_TREE, Baseline, baseline  # pylint: disable=unused-import

__all__ = ['BOUNDINGS', 'EXECUTION_KEYS', 'ConfigError', 'TrainConfig',
           'blur_clip_norm', 'check_noise', 'default_experiment_name',
           'fields', 'flag_error', 'validate']

# The --bounding values: tff_clip's registered boundings and the baselines
# (`tff_clip.aggregation.baselines`: none and TFF's own aggregators).
BOUNDINGS = ((NO_BOUNDING,) + mechanisms.BOUNDINGS.names +
             (TFF_GAUSSIAN, TFF_TREE))

# How a run is executed, not what it computes: these may change on resume.
EXECUTION_KEYS = ('executor', 'max_concurrent_clients', 'client_execution',
                  'workers', 'worker_timeout_s', 'progress', 'root_output_dir',
                  'checkpoint_every', 'checkpoint_interval_s', 'plot')

# Earlier names of fields, read from a recorded config.json on resume (one
# name per knob: the library's `tff_clip.learning.algorithms` argument names).
RENAMED_KEYS = {'local_clip': 'local_clip_norm', 'blur_lambda': 'blur_strength'}
# Knobs added with a default that behaves otherwise than the runs recorded
# before them: what those runs did (a run recorded without --server_step
# kept its server learning rate).
LEGACY_DEFAULTS = {'server_step': 'fixed'}
DEFAULT_CLIENTS_PER_ROUND = 20  # Unless separated: the smallest group.

SEED_MAX = 2**32 - 1  # The largest --seed: numpy's and Keras' are 32-bit.


class ConfigError(ValueError):
  """A configuration that cannot run; raised before anything is written."""


def _field(default, help_text: str, choices=None, flag=None):
  """A field and its flag (named `flag`, default: the field's name)."""
  return dataclasses.field(default=default, metadata=dict(
      help=help_text, choices=choices, flag=flag))


def _dp(name: str):
  """The field of DP parameter `name`: its default, help and choices as
  declared in `tff_clip.aggregation.spec.DPSpec` (arguments written as flags)."""
  declared = spec.parameter(name)
  return _field(declared.default,
                re.sub(r'`(\w+)`', r'--\1', declared.metadata['help']),
                declared.metadata['choices'])


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything a run depends on; each field is a flag of `scripts.train`."""
  # The task.
  task: str = _field('digits', 'Task name.')
  data_source: str = _field(
      'offline', 'offline: no network (digits, tinyshakespeare, generated); '
      'online: the real data set, downloaded once into --cache_dir; '
      "synthetic: TFF's get_synthetic().", names.DATA_SOURCES)
  task_options: tuple = _field(
      (), 'A task option as key=value (repeat the flag for several), e.g. '
      '--task_option=noise=student_t --task_option=tail_index=1.5 for '
      'fat_tailed_quadratic, --task_option=offline_data=mnist (real 28x28 '
      'MNIST) for the EMNIST tasks. Values: numbers, none, true/false, comma '
      'lists, else strings. A task\'s options: tasks.task_options(name).',
      flag='task_option')
  num_clients: Optional[int] = _field(None, 'Training clients (task default).')
  partition: Optional[str] = _field(
      None, 'Partition for image tasks (iid, dirichlet, classes_per_client, '
      'shards, small_large).')
  partition_alpha: Optional[float] = _field(None, 'Dirichlet alpha (> 0).')
  validation_fraction: Optional[float] = _field(
      None, 'Hold out this share of the training examples (stratified, '
      'before the split into clients) as validation data, in (0, 1).')
  eval_split: str = _field(
      'test', 'What centralized evaluation measures: test, or validation '
      "(the task's validation data; see --validation_fraction).",
      names.EVAL_SPLITS)
  # Bounding. tff_clip's default: clipping or normalization, and the adaptive
  # norm's target quantile, chosen from the run's public noise numbers
  # (`tff_clip.aggregation.noise_following`; docs/frontier_history_2.md).
  bounding: str = _field(
      'noise_following', 'How each client update is bounded before '
      'aggregation. noise_following: clip, or normalize where the noise on '
      f'the mean update is at least {noise_following.NORMALIZE_FROM:g} C (z '
      f'sqrt(d) / n >= {noise_following.NORMALIZE_FROM:g}); chosen '
      "from public numbers, recorded as the run summary's `bounding`.",
      BOUNDINGS)
  # The DP parameters, declared in `tff_clip.aggregation.spec.DPSpec` (`dp_spec`).
  clip_norm: Union[float, str] = _dp('clip_norm')
  split: str = _dp('split')
  initial_clip_norm: float = _dp('initial_clip_norm')
  target_quantile: Optional[float] = _dp('target_quantile')
  clip_learning_rate: float = _dp('clip_learning_rate')
  clipped_count_stddev: Optional[float] = _dp('clipped_count_stddev')
  per_layer_quantiles: bool = _dp('per_layer_quantiles')
  # Privacy.
  noise_multiplier: Optional[float] = _field(
      0.5, "Gaussian noise multiplier z ('none': no DP). Excludes "
      '--target_epsilon.')
  target_epsilon: Optional[float] = _field(
      None, 'Calibrate z to reach this epsilon at --delta after --rounds.')
  delta: float = _field(1e-5, 'DP delta, in (0, 0.01] (docs/privacy.md).')
  noise_placement: str = _dp('noise_placement')
  denominator: str = _dp('denominator')
  noise_seed: Optional[int] = _dp('noise_seed')
  release_uncovered_metrics: bool = _field(
      False, 'Under DP, also release what epsilon does not cover (cohort '
      'size, client training metrics, synthetic objective, round seconds); '
      'summary.json lists them under not_covered_by_epsilon.')
  clients_per_round: Optional[int] = _field(None, 'Clients per round (expected '
      'under poisson); default 20, under min_separation its smallest group.')
  sampling: str = _field('poisson', 'Client sampling; the ledger accounts the '
                         'one used. min_separation: round t takes group t mod '
                         'b of b seeded client groups (b = --min_separation), '
                         'no amplification.', names.SAMPLINGS)
  noise_mechanism: str = _dp('noise_mechanism')
  bands: int = _dp('bands')
  blt_buffers: int = _dp('blt_buffers')
  min_separation: Optional[int] = _field(
      None, 'Groups b of --sampling=min_separation: a client takes part at '
      'most every b rounds (default: --bands).')
  # Training.
  rounds: int = _field(30, 'Training rounds, at most 100,000.')
  client_optimizer: str = _field('sgd', 'Client optimizer.',
                                 names.CLIENT_OPTIMIZERS)
  client_learning_rate: float = _field(0.1, 'Client learning rate eta_L.')
  server_optimizer: str = _field('sgd', 'Server optimizer.',
                                 names.SERVER_OPTIMIZERS)
  server_learning_rate: Optional[float] = _field(
      None, 'Server learning rate eta (default: ' + ', '.join(
          f'{lr} for {o}' for o, lr in names.SERVER_LEARNING_RATES.items()) + ')')
  server_momentum: float = _field(0.9, 'Momentum of --server_optimizer=sgdm.')
  server_step: str = _field(
      'auto', 'damped: halve the server learning rate when consecutive '
      '(noised) updates point apart beyond what noise explains '
      '(tff_clip.learning.server_step.oscillation_damped); held: damped, '
      'and no longer than the smallest update norm since round 10 '
      '(server_step.growth_held); both post-processing, no privacy cost; '
      'fixed: neither. auto: damped in DP runs of tff_clip\'s boundings '
      'with independent noise, else fixed.',
      names.SERVER_STEPS)
  local_epochs: int = _field(1, 'Passes over the client data per round.')
  local_steps: Optional[int] = _field(
      None, 'If set, exactly this many local steps (batches).')
  batch_size: int = _field(16, 'Client batch size.')
  local_clip_norm: Optional[float] = _field(
      None, 'Per-step gradient clip (FAT-Clipping PI / local clipping).')
  blur_strength: Optional[float] = _field(None, 'BLUR regularisation strength.')
  blur_clip_norm: Optional[float] = _field(
      None, 'BLUR radius S (default: --clip_norm when numeric).')
  lus_sparsity: Union[float, tuple, None] = _field(
      None, 'LUS sparsity c in [0, 1): one value for every layer, or one per '
      'trainable layer (comma list).')
  eval_every: int = _field(5, 'Centralized evaluation every this many rounds.')
  # Outputs and execution.
  root_output_dir: str = _field('runs', 'Output root.')
  experiment_name: str = _field(
      '', 'Run name, the directory under --root_output_dir (default: '
      'task_bounding[_dp]_seedN, then _ and 8 hex digits of a hash of the '
      'other flags that differ from their defaults, so that different '
      'commands never share a directory and the same command resumes).')
  seed: int = _field(0, 'Seed of data order, initialization and sampling (a '
                     "private run's cohorts and noise: secret keys instead).")
  executor: str = _field(
      'inprocess', "inprocess: TFF's MapReduceForm run in this process "
      "(tff_clip.runtime.simulation; fastest on one machine); local: TFF's C++ "
      'runtime; gpu: the same, refusing to run without a visible GPU; '
      'remote: TFF workers (--workers).', names.EXECUTORS)
  max_concurrent_clients: Optional[int] = _field(
      None, 'Clients trained at once: the in-process executor\'s threads '
      '(default: one per CPU core, at most 4), the local worker\'s limit '
      '(default: none).')
  client_execution: str = _field(
      'auto', "batched: a round's clients in one TensorFlow call; per_client: "
      'one by one; auto: batched where the run allows it.',
      names.CLIENT_EXECUTIONS)
  workers: tuple = _field((), 'Remote executor: host:port of each TFF '
                          'worker_binary, comma-separated.')
  worker_timeout_s: float = _field(
      30.0, 'Seconds to wait for a reachable remote worker to be ready.')
  checkpoint_every: int = _field(
      1, 'Checkpoint every this many rounds. A DP run releases its rounds '
      'only once a checkpoint covers them (up to this many at a time); a '
      'killed run computes the rounds after its last checkpoint again.')
  checkpoint_interval_s: float = _field(
      0.0, "Skip a round's checkpoint while the last one is younger than "
      'this (0: every --checkpoint_every rounds). A killed run then re-runs '
      'up to that many seconds. Runs without DP only.')
  cache_dir: Optional[str] = _field(None, 'Online data cache directory.')
  progress: bool = _field(True, 'Show a progress bar (off: one line a round).')
  plot: bool = _field(True, 'Draw plot.png from metrics.csv at the end.')
  # Empirical privacy audit (`tff_clip.privacy.audit`, docs/audit.md).
  audit_canaries: int = _field(
      0, 'Empirical privacy audit: about this many canary clients (0: none, '
      'nothing changes; at most 10,000). See docs/audit.md.')
  audit_confidence: float = _field(
      0.95, "Confidence of the audit's epsilon lower bound.")

  def __post_init__(self):
    for name, default in _resolved_defaults(self).items():
      if getattr(self, name) is None:
        object.__setattr__(self, name, default)
    if not self.experiment_name:
      object.__setattr__(self, 'experiment_name',
                         default_experiment_name(self))

  @property
  def output_dir(self) -> str:
    return os.path.join(self.root_output_dir, self.experiment_name)

  @property
  def separation(self) -> int:
    """The participation separation of --sampling=min_separation."""
    return self.bands if self.min_separation is None else self.min_separation

  @property
  def private(self) -> bool:
    return self.noise_multiplier is not None or self.target_epsilon is not None

  @property
  def participation_separation(self) -> Optional[int]:
    """The minimum separation of participation: None unless
    --sampling=min_separation."""
    return (self.separation if self.sampling == names.MIN_SEPARATION else
            None)

  def _dp_parameters(self) -> dict[str, Any]:
    """The fields that are DP parameters (`spec.PARAMETERS`), by name."""
    return {name: getattr(self, name) for name in spec.PARAMETERS
            if name in self.__dataclass_fields__}

  @property
  def noise(self):
    """The noise mechanism of the flags (`tff_clip.aggregation.noise_mechanisms`)."""
    return mechanisms.noise_mechanism_from(self._dp_parameters(),
                                           self.participation_separation)

  def dp_spec(self, noise_multiplier: float,
              bounding_method: Optional[str] = None) -> spec.DPSpec:
    """The DP aggregation these flags describe, checked (`spec.DPSpec`).

    `bounding_method`: in place of --bounding (a baseline's stand-in). The
    participation schema is the run's: --rounds, and the separation of
    --sampling=min_separation.
    """
    declared = self._dp_parameters()
    declared.update(bounding_method=bounding_method or self.bounding,
                    noise_multiplier=noise_multiplier,
                    clients_per_round=1 if self.clients_per_round is None
                    else self.clients_per_round,  # None: `with_population`.
                    min_separation=self.participation_separation)
    return spec.DPSpec(**declared)

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out['workers'] = list(self.workers)
    out['task_options'] = {key: (list(value) if isinstance(value, tuple)
                                 else value)
                           for key, value in self.task_options}
    if isinstance(self.lus_sparsity, tuple):
      out['lus_sparsity'] = list(self.lus_sparsity)
    return out

  def identity(self) -> dict[str, Any]:
    """What must match for a rerun to resume (not how it is executed)."""
    out = self.to_json()
    for key in EXECUTION_KEYS:
      out.pop(key)
    return out


# What the default run name spells out (`default_experiment_name`).
_NAMED = ('task', 'bounding', 'seed', 'experiment_name')


def _canonical(value):
  """`value` as hashed: numbers as floats (`--clip_norm=1` is 1.0), lists."""
  if isinstance(value, (tuple, list)):
    return [_canonical(v) for v in value]
  numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
  return float(value) if numeric else value


def _resolved_defaults(config: TrainConfig) -> dict[str, Any]:
  """The defaults that follow other fields (None: separated, or unknown)."""
  return {'clients_per_round': None if config.participation_separation else
          DEFAULT_CLIENTS_PER_ROUND, 'server_learning_rate':
          names.SERVER_LEARNING_RATES.get(config.server_optimizer)}


def default_experiment_name(config: TrainConfig) -> str:
  """`task_bounding[_dp]_seedN[_HASH]`, the run's directory name.

  HASH (8 hex digits of SHA-256) covers every field that differs from its
  default and is not in the name or one of `EXECUTION_KEYS` (how a run is
  executed may change on resume): the command with no flags is
  `digits_noise_following_dp_seed0`, two commands that differ in what they
  compute get different directories, and the same command (or the same
  flags in another order, or a default given explicitly) finds its run again.
  """
  defaults = {field.name: field.default for field in dataclasses.fields(config)
              } | _resolved_defaults(config)
  changed = {name: _canonical(getattr(config, name))
             for name, default in defaults.items()
             if name not in _NAMED + EXECUTION_KEYS
             and getattr(config, name) != default}
  if changed.get('noise_multiplier', 0) is None:
    del changed['noise_multiplier']  # No `_dp`, or --target_epsilon.
  name = (f'{config.task}_{config.bounding}{"_dp" if config.private else ""}'
          f'_seed{config.seed}')
  if not changed:
    return name
  text = json.dumps(changed, sort_keys=True, default=str)
  return f'{name}_{hashlib.sha256(text.encode()).hexdigest()[:8]}'


def fields() -> list[tuple[dataclasses.Field, Any]]:
  """(field, resolved type) for every `TrainConfig` field, in order."""
  hints = typing.get_type_hints(TrainConfig)
  return [(f, hints[f.name]) for f in dataclasses.fields(TrainConfig)]


# Validation. The largest value of an int flag: counts enter TensorFlow as int32.
_INT32_MAX = 2**31 - 1


def _check(rule, value, name, *args, optional=False, **kwargs):
  """Flag `name` checked by the `tff_clip.checks` `rule` (None passes when
  `optional`): the library's one rule, its error a `ConfigError`."""
  if value is None and optional:
    return
  try:
    rule(value, name, *args, **kwargs)
  except (TypeError, ValueError) as e:
    raise flag_error(e) from None


def _positive(value, name, optional=False, dtype=np.float32):
  _check(checks.positive_float, value, name, dtype, optional=optional)


def _count(value, name, optional=False):
  _check(checks.integer, value, name, minimum=1, maximum=_INT32_MAX,
         optional=optional)


def one_of(value, name, choices):
  _check(checks.one_of, value, name, choices)


def _check_choices(config):
  for field, _ in fields():
    if field.metadata.get('choices'):
      one_of(getattr(config, field.name), field.name, field.metadata['choices'])


_FLAG_NAMES = {'separation': 'min_separation'}  # Library name: flag name.


def flag_error(error: Exception) -> ConfigError:
  """The library's error, each `name` of a flag (or the library's name of
  one, `_FLAG_NAMES`) written as --name; other names stay as they are."""
  names = {**{name: name for name in TrainConfig.__dataclass_fields__},
           **_FLAG_NAMES}
  return ConfigError(re.sub(r'`(\w+)`', lambda m: f'--{names[m[1]]}' if m[1]
                            in names else m[0], str(error)))


def _check_mechanism(config):
  """The bounding and DP knobs: the library's own spec checks them."""
  if config.noise_multiplier is not None and config.target_epsilon is not None:
    raise ConfigError(
        f'--noise_multiplier={config.noise_multiplier} and --target_epsilon='
        f'{config.target_epsilon} both set the noise: give one of them '
        '(--target_epsilon calibrates the noise multiplier).')
  if checks.is_real(config.noise_multiplier) and config.noise_multiplier == 0:
    raise ConfigError(
        '--noise_multiplier=0 adds no noise: a DP run needs z > 0 (its '
        'epsilon would be infinite). For a run without DP say '
        '--noise_multiplier=none.')
  # A baseline --bounding's other knobs are checked as a tff_clip bounding
  # would check them: the first registered one stands in.
  stand_in = (None if config.bounding in mechanisms.BOUNDINGS else
              mechanisms.BOUNDINGS.names[0])
  try:
    # Calibrated later from --target_epsilon; 0 stands in until then.
    dp_spec = config.dp_spec(0.0 if config.noise_multiplier is None else
                             config.noise_multiplier, stand_in)
  except (TypeError, ValueError) as e:
    raise flag_error(e) from None
  unread = spec.unread(dp_spec, {f.name for f in dataclasses.fields(config)
                                 if getattr(config, f.name) != f.default})
  if unread is not None:  # A flag given that would change nothing.
    raise ConfigError(f'--{unread[0]}={getattr(config, unread[0])} applies '
                      f'only with {unread[1]}; it would change nothing here. '
                      'Leave it out.')


def check_noise(config: TrainConfig, noise_multiplier: float) -> None:
  """`config`'s mechanism checked with z = `noise_multiplier` (calibrated)."""
  _check_mechanism(dataclasses.replace(
      config, noise_multiplier=noise_multiplier, target_epsilon=None))


def _check_privacy(config):
  _positive(config.target_epsilon, 'target_epsilon', optional=True,
            dtype=np.float64)
  baseline = BASELINES.get(config.bounding)
  if baseline is not None:
    _check(baseline.check, config, config.bounding)
  if config.denominator == 'actual' and config.sampling != names.FIXED_SIZE:
    raise ConfigError('--denominator=actual releases the cohort size, which '
                      'is secret under --sampling=poisson; use '
                      '--sampling=fixed_size or --denominator=expected.')
  if config.private and config.noise_placement == 'client' and (
      config.sampling == names.POISSON):  # n shares of the noise, m < n come.
    raise ConfigError('--noise_placement=client under Poisson sampling: a '
                      'cohort below n carries less noise than the ledger '
                      'accounts; use --sampling=fixed_size.')
  _check(checks.delta, config.delta, 'delta')


def _check_training(config):
  _check(checks.integer, config.seed, 'seed', minimum=0, maximum=SEED_MAX)
  _count(config.clients_per_round, 'clients_per_round', optional=True)
  _check(checks.rounds, config.rounds, 'rounds')
  for name in ('client_learning_rate', 'server_learning_rate'):
    _positive(getattr(config, name), name)  # Not subnormal either:
    _check(checks.normal_float, getattr(config, name), name)  # flushed to 0.
  _check(checks.probability, config.server_momentum, 'server_momentum',
         low_open=False)
  _count(config.local_epochs, 'local_epochs')
  _count(config.local_steps, 'local_steps', optional=True)
  _count(config.batch_size, 'batch_size')
  _check(checks.integer, config.num_clients, 'num_clients', minimum=1,
         maximum=checks.MAX_NUM_CLIENTS, optional=True)
  _positive(config.partition_alpha, 'partition_alpha', optional=True)
  _check(checks.probability, config.validation_fraction,
         'validation_fraction', optional=True)
  try:
    spec.check_client_arguments(
        blur_strength=config.blur_strength,
        blur_clip_norm=blur_clip_norm(config),
        lus_sparsity=config.lus_sparsity,
        local_clip_norm=config.local_clip_norm,
        client_learning_rate=config.client_learning_rate)
  except (TypeError, ValueError) as e:
    raise flag_error(e) from None
  _count(config.eval_every, 'eval_every')
  _count(config.checkpoint_every, 'checkpoint_every')
  _check(checks.nonnegative_float, config.checkpoint_interval_s,
         'checkpoint_interval_s', np.float64)
  # A DP run releases a round once a checkpoint covers it, checkpointing by
  # round count: by the clock, the release times would show the round times.
  if config.private and config.checkpoint_interval_s != 0:
    raise ConfigError('--checkpoint_interval_s must be 0 for a DP run (its '
                      'rounds are released when a checkpoint covers them, '
                      'every --checkpoint_every rounds); got '
                      f'{config.checkpoint_interval_s!r}.')


def _check_execution(config):
  _count(config.max_concurrent_clients, 'max_concurrent_clients',
         optional=True)
  _positive(config.worker_timeout_s, 'worker_timeout_s')
  if config.executor == 'remote' and not config.workers:
    raise ConfigError('--executor=remote needs --workers=host:port,...')
  if config.workers and config.executor != 'remote':
    raise ConfigError('--workers needs --executor=remote; got --executor='
                      f'{config.executor}.')
  for worker in config.workers:
    host, _, port = str(worker).rpartition(':')
    if not host or not port.isdigit():
      raise ConfigError(f'--workers entries must be host:port; got {worker!r}.')
  if (not isinstance(config.experiment_name, str) or
      not config.experiment_name or os.sep in config.experiment_name or
      config.experiment_name in ('.', '..')):
    raise ConfigError('--experiment_name must be a non-empty name without '
                      f'{os.sep!r}; got {config.experiment_name!r}.')
  _check(checks.path_text, config.experiment_name, 'experiment_name')
  if not isinstance(config.root_output_dir, str) or not (
      config.root_output_dir.strip()):
    raise ConfigError('--root_output_dir must name a directory (e.g. runs); '
                      f'got {config.root_output_dir!r}.')
  _check(checks.path_text, config.root_output_dir, 'root_output_dir')


def _check_audit(config):
  _check(checks.integer, config.audit_canaries, 'audit_canaries',
         maximum=checks.MAX_AUDIT_CANARIES)
  if config.audit_canaries and (not config.private or
                                config.bounding in BASELINES):
    raise ConfigError('--audit_canaries audits a tff_clip DP run: set '
                      '--noise_multiplier or --target_epsilon and a tff_clip '
                      '--bounding.')
  _check(checks.probability, config.audit_confidence, 'audit_confidence')


def _check_correlated(config):
  _count(config.min_separation, 'min_separation', optional=True)
  # The mechanism's own checks (placement, bands: `_check_mechanism`).
  noise = config.noise
  if not config.private:
    if noise.correlated:
      raise ConfigError(
          f'--noise_mechanism={noise.name} correlates DP noise across rounds: '
          'it needs --noise_multiplier or --target_epsilon.')
    return
  try:
    noise.check_participation()
  except ValueError as e:
    raise flag_error(e) from None
  if noise.correlated and config.server_step in ('damped', 'held'):
    raise ConfigError(f'--server_step={config.server_step} reads opposed '
                      f'updates as oscillation; --noise_mechanism={noise.name}'
                      " opposes consecutive rounds' noise by design: use "
                      '--server_step=fixed (or auto).')


def blur_clip_norm(config: TrainConfig) -> Optional[float]:
  """BLUR's radius S (its one definition): --blur_clip_norm, else a numeric
  --clip_norm under BLUR (`validate` refuses S without BLUR)."""
  if config.blur_clip_norm is not None or config.blur_strength is None:
    return config.blur_clip_norm
  return (None if config.clip_norm is None or isinstance(config.clip_norm, str)
          else float(config.clip_norm))


# Flags that apply only where another says so: given elsewhere (a value
# other than the default) they would change nothing without a word (a fixed
# --clip_norm with --target_quantile is not the adaptive norm it suggests).
# The DP parameters' own rules are `spec.unread` (`_check_mechanism`).
_BOUNDING = 'a bounding (--bounding other than none)'


def _bounds(config) -> bool:
  return config.bounding != NO_BOUNDING


_APPLIES = (
    ('min_separation', lambda c: c.participation_separation is not None,
     '--sampling=min_separation'),
    ('clipped_count_stddev', lambda c: c.private,
     'DP (--noise_multiplier or --target_epsilon)'),
    ('server_momentum', lambda c: c.server_optimizer == 'sgdm',
     '--server_optimizer=sgdm'),
    ('audit_confidence', lambda c: c.audit_canaries, '--audit_canaries'),
    # --bounding=none bounds nothing: its norm's knobs are read by nothing
    # (but BLUR's radius, which is --clip_norm where not given).
    ('clip_norm', lambda c: _bounds(c) or (
        c.blur_strength is not None and c.blur_clip_norm is None), _BOUNDING),
    *((knob, _bounds, _BOUNDING) for knob in (
        'target_quantile', 'initial_clip_norm', 'clip_learning_rate')),
)


def _check_no_ops(config):
  for flag, applies, where in _APPLIES:
    value = getattr(config, flag)
    if value != TrainConfig.__dataclass_fields__[flag].default and (
        not applies(config)):
      raise ConfigError(f'--{flag}={value} applies only with {where}; it '
                        'would change nothing here. Leave it out.')


def validate(config: TrainConfig) -> None:
  """Raises `ConfigError` naming the flag for a configuration that cannot run."""
  _check_choices(config)
  _check_audit(config)
  _check_mechanism(config)
  _check_privacy(config)
  _check_correlated(config)
  _check_training(config)
  _check_execution(config)
  _check_no_ops(config)
