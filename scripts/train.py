r"""Federated training with bounded (and optionally private) client updates.

With no flags: {defaults}; about a minute on 2 cores:

  .venv/bin/python -m scripts.train

Kill it at any moment and run the same command again: it resumes from its last
checkpoint; run it once more after it finished and it only says where the
results are. Each command has a directory of its own under --root_output_dir
(see --experiment_name). A bad flag is one line on stderr and exit code 2,
before anything is written.

Every flag below is a field of `tff_clip.program.config.TrainConfig`, and the bounding
and DP flags are the arguments of `tff_clip.aggregation.dp.dp_factory` under the same
names. The names TFF and federated_research give the same knobs are aliases:
{aliases} (docs/training.md). docs/training.md has EMNIST, CIFAR-10,
Shakespeare and Stack Overflow command lines.
"""

import os
import sys
import textwrap
import typing

from absl import flags
from absl import logging

from scripts import cli
from scripts import program
from tff_clip import checks
from tff_clip.program import config as config_lib
from tff_clip.program import flag_text

FLAGS = flags.FLAGS

# The names TFF (`DifferentiallyPrivateFactory.gaussian_adaptive`) and
# federated_research's trainers give the same knobs: accepted as they are,
# so that a TFF user's command line needs no translation (docs/training.md).
ALIASES = {
    'total_rounds': 'rounds',
    'client_batch_size': 'batch_size',
    'client_epochs_per_round': 'local_epochs',
    'rounds_per_eval': 'eval_every',
    'target_unclipped_quantile': 'target_quantile',
    'initial_l2_norm_clip': 'initial_clip_norm',
    'adaptive_clip_learning_rate': 'clip_learning_rate',
}


def _optional(parse):
  """Parser for a flag that also accepts 'none' (said, never left empty)."""
  def parser(text):
    if text is None or str(text).strip().lower() == 'none':
      return None
    if not str(text).strip():
      # `--noise_multiplier=$Z` with Z unset must not turn DP off.
      raise ValueError('empty')
    return parse(text)
  return parser


def _number_or_word(text):
  try:
    return _float(text)
  except ValueError:
    return text


# Numbers in ASCII only ('٣', '１' and '1_0' are refused, not read as 3, 1
# and 10): `checks.ascii_number`.
def _int(text):
  return checks.ascii_number(text, int)


def _float(text):
  return checks.ascii_number(text, float)


_PARSERS = {
    int: _int, float: _float, str: str,
    typing.Optional[int]: _optional(_int),
    typing.Optional[float]: _optional(_float),
    typing.Optional[str]: _optional(str),
    typing.Union[float, str]: _number_or_word,
}


def _choices(field):
  if field.name == 'task':
    from tasks import names as task_names  # pylint: disable=g-import-not-at-top
    return task_names.TASK_NAMES  # Read without TensorFlow.
  return field.metadata.get('choices')


def define_flags():
  """One flag per `TrainConfig` field: same name, default and help."""
  for field, kind in config_lib.fields():
    help_text = field.metadata['help']
    choices = _choices(field)
    if choices:
      help_text += f' One of: {", ".join(choices)}.'
    name = field.metadata.get('flag') or field.name
    if field.name == 'task_options':
      flags.DEFINE_multi_string(name, [], help_text)
    elif kind is bool:
      flags.DEFINE_bool(field.name, field.default, help_text)
    elif kind is tuple:
      flags.DEFINE_list(field.name, list(field.default), help_text)
    else:
      default = field.default
      # Strings are parsed in `config_from_flags`, so that a bad value is
      # reported as one line naming the flag, like every other error.
      flags.DEFINE_string(field.name, None if default is None else str(default),
                          help_text)
  for alias, name in ALIASES.items():
    flags.DEFINE_alias(alias, name)


def describe_defaults() -> str:
  """What a run with no flags is, read from `TrainConfig`'s defaults."""
  config = config_lib.TrainConfig()
  privacy = ('no DP' if config.noise_multiplier is None else
             f'DP-FedAvg with --noise_multiplier={config.noise_multiplier}')
  return (f'--task={config.task} (--data_source={config.data_source}), '
          f'{privacy}, --bounding={config.bounding} '
          f'--clip_norm={config.clip_norm}, '
          f'{config.clients_per_round} clients per round, {config.rounds} '
          f'rounds, written to {config.output_dir}/')


def config_from_flags() -> config_lib.TrainConfig:
  """The configuration the flags describe; `ConfigError` names a bad flag."""
  values = {}
  for field, kind in config_lib.fields():
    value = FLAGS[field.metadata.get('flag') or field.name].value
    if field.name == 'task_options':
      value = flag_text.parse_task_options(value)
    elif field.name == 'lus_sparsity':
      if value is not None and not str(value).strip():
        raise config_lib.ConfigError(
            "--lus_sparsity is empty (an unset shell variable? Say 'none' "
            'for no sparsification).')
      value = flag_text.parse_lus_sparsity(value)
    elif kind is tuple:
      value = tuple(value)
    elif kind is not bool:
      try:
        value = _PARSERS[kind](value)
      except ValueError:
        text = str(FLAGS[field.name].value)
        empty = not text.strip()
        raise config_lib.ConfigError(
            f'--{field.name} must be {_describe(kind)}; got '
            f'{FLAGS[field.name].value!r}' + (
                " (empty: an unset shell variable? Say 'none' for none)"
                if empty and kind in _OPTIONAL else
                ' (ASCII digits, no underscores)'
                if not text.isascii() or '_' in text else '') + '.') from None
    values[field.name] = value
  # DP is the default, unless the user asked for calibration or no bounding.
  if not FLAGS['noise_multiplier'].present and (
      values['target_epsilon'] is not None or values['bounding'] == 'none'):
    values['noise_multiplier'] = None
  return config_lib.TrainConfig(**values)


_OPTIONAL = (typing.Optional[int], typing.Optional[float],
             typing.Optional[str])


def _describe(kind) -> str:
  return {int: 'an integer', float: 'a number',
          typing.Optional[int]: 'an integer or none',
          typing.Optional[float]: 'a number or none',
          typing.Optional[str]: 'a value or none'}.get(kind, 'a value')


def _check(config: config_lib.TrainConfig) -> None:
  """What `main` checks before training; `ConfigError` names a bad flag."""
  program.validate(config)  # With --target_epsilon's floor.
  program.preflight(config)  # Run directory, population, target, workers.


def main(argv) -> int:
  if len(argv) > 1:
    return cli.fail(f'unexpected arguments: {" ".join(argv[1:])} (see --help)')
  try:
    config = config_from_flags()
    _check(config)
  except config_lib.ConfigError as e:
    return cli.fail(e)
  # Checked. TensorFlow is imported only now (by `training.run`, after it
  # checked the run directory and found the run is not already finished)
  # -- and never inside absl's `app.run`, which this script does not use:
  # imported first inside app.run's main, Keras 2.14 builds functional
  # models from graph tensors ("Attempt to convert a value (None)" in
  # Flatten).
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # TF/TFF info logs hide the bar.
  from tff_clip.program import run_records  # pylint: disable=g-import-not-at-top
  try:
    summary = program.run(config, checked=True)  # `_check`: checked once.
  except config_lib.ConfigError as e:
    return cli.fail(e)
  except run_records.RunRecordError as e:  # Damaged records, full disk.
    cli.fail(e)
    return 1
  except Exception as e:  # pylint: disable=broad-except
    # Looked up, not imported: both modules import TensorFlow, which a
    # refusal never needs.
    sources = sys.modules.get('tasks.sources')
    if sources is not None and isinstance(e, sources.DataNotAvailableError):
      return cli.fail(e)  # The task's data is missing; nothing was written.
    split_execution = sys.modules.get('tff_clip.runtime.split_execution')
    if split_execution is None or not isinstance(
        e, split_execution.WorkerLostError):
      raise
    cli.fail(e)  # Checkpointed: a rerun resumes.
    return 1
  print(program.format_summary(summary))
  plot = ' plot.png,' if config.plot else ''
  print(f'outputs: {config.output_dir}/ (metrics.csv, releases.jsonl, '
        f'ledger.json, summary.json,{plot} tensorboard/, checkpoints/)')
  return 0


def first_refusal(runs) -> str:
  """'INDEX message' for the first of `runs` (each the flags of a run) that
  `main` would refuse before training, else ''. Used by `scripts.sweep`."""
  for index, argv in enumerate(runs):
    FLAGS.unparse_flags()
    try:
      rest = FLAGS(['scripts.train', *argv])
      if len(rest) > 1:
        return f'{index} unexpected arguments: {" ".join(rest[1:])}'
      _check(config_from_flags())
    except (flags.Error, config_lib.ConfigError) as e:
      return f'{index} {" ".join(str(e).split())}'
  return ''


def interrupted() -> str:
  """What a Ctrl-C prints: where a rerun of the same command goes on.

  Read from the run directory, as the rerun will read it: it resumes after
  the newest checkpoint (a DP run saves each round's before releasing it).
  """
  from tff_clip.program import checkpoints  # pylint: disable=g-import-not-at-top
  config = config_from_flags()
  out = config.output_dir
  if not os.path.exists(os.path.join(out, 'config.json')):
    return 'rerun the same command to start the run'
  if os.path.exists(os.path.join(out, 'summary.json')):
    return 'the run had finished; rerun the same command to see its results'
  versions = checkpoints.Checkpoints(os.path.join(out, 'checkpoints')
                                     ).versions()
  next_round = (versions[-1] if versions else 0) + 1
  if next_round > config.rounds:
    return (f'all {config.rounds} rounds are trained; rerun the same command '
            'to finish (ledger, summary, plot)')
  return f'rerun the same command to resume from round {next_round}'


define_flags()
# What `--help` prints first, filled in from the declarations above.
__doc__ = '\n\n'.join(  # pylint: disable=redefined-builtin
    paragraph if paragraph.startswith(' ') else textwrap.fill(paragraph, 79)
    for paragraph in __doc__.format(
        defaults=describe_defaults(),
        aliases=', '.join(f'--{alias}' for alias in ALIASES)).split('\n\n'))

if __name__ == '__main__':
  cli.run(main, interrupted=interrupted, fast_exit=True)
