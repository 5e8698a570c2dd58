r"""Federated training with bounded (and optionally private) client updates.

With no flags: federated scikit-learn digits (real handwritten digits, offline),
DP-FedAvg with adaptive clipping, 30 rounds, about a minute on 2 cores:

  .venv/bin/python -m scripts.train

Kill it at any moment and run the same command again: it resumes from its last
checkpoint; run it once more after it finished and it only says where the
results are. A bad flag is one line on stderr and exit code 2, before anything
is written. Every flag is a field of `tff_clip.config.TrainConfig`; see
`--help` for all of them and README.md for EMNIST, CIFAR-10, Shakespeare and
Stack Overflow command lines.
"""

import os
import sys
import typing

from absl import flags
from absl import logging

from scripts import cli
from scripts import program
from tff_clip import config as config_lib

FLAGS = flags.FLAGS


def _optional(parse):
  """Parser for a flag that also accepts 'none'."""
  def parser(text):
    if text is None or str(text).strip().lower() in ('none', ''):
      return None
    return parse(text)
  return parser


def _number_or_word(text):
  try:
    return float(text)
  except ValueError:
    return text


_PARSERS = {
    int: int, float: float, str: str,
    typing.Optional[int]: _optional(int),
    typing.Optional[float]: _optional(float),
    typing.Optional[str]: _optional(str),
    typing.Union[float, str]: _number_or_word,
}


def define_flags():
  """One flag per `TrainConfig` field: same name, default and help."""
  for field, kind in config_lib.fields():
    help_text = field.metadata['help']
    choices = field.metadata.get('choices')
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


def config_from_flags() -> config_lib.TrainConfig:
  """The configuration the flags describe; `ConfigError` names a bad flag."""
  values = {}
  for field, kind in config_lib.fields():
    value = FLAGS[field.metadata.get('flag') or field.name].value
    if field.name == 'task_options':
      value = config_lib.parse_task_options(value)
    elif field.name == 'lus_sparsity':
      value = config_lib.parse_lus_sparsity(value)
    elif kind is tuple:
      value = tuple(value)
    elif kind is not bool:
      try:
        value = _PARSERS[kind](value)
      except ValueError:
        raise config_lib.ConfigError(
            f'--{field.name} must be {_describe(kind)}; got '
            f'{FLAGS[field.name].value!r}.') from None
    values[field.name] = value
  # DP is the default, unless the user asked for calibration or no bounding.
  if not FLAGS['noise_multiplier'].present and (
      values['target_epsilon'] is not None or values['bounding'] == 'none'):
    values['noise_multiplier'] = None
  return config_lib.TrainConfig(**values)


def _describe(kind) -> str:
  return {int: 'an integer', float: 'a number',
          typing.Optional[int]: 'an integer or none',
          typing.Optional[float]: 'a number or none'}.get(kind, 'a value')


def main(argv) -> int:
  if len(argv) > 1:
    return cli.fail(f'unexpected arguments: {" ".join(argv[1:])} (see --help)')
  try:
    config = config_from_flags()
    program.validate(config)
  except config_lib.ConfigError as e:
    return cli.fail(e)
  # Checked. TensorFlow is imported only now (by `training.run`, after it
  # found the run is not already finished) -- and never inside absl's
  # `app.run`, which this script does not use: imported first inside
  # app.run's main, Keras 2.14 builds functional models from graph tensors
  # ("Attempt to convert a value (None)" in Flatten).
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # TF/TFF info logs hide the bar.
  from tff_clip import run_records  # pylint: disable=g-import-not-at-top
  from tff_clip import split_execution  # pylint: disable=g-import-not-at-top
  try:
    summary = program.run(config)
  except config_lib.ConfigError as e:
    return cli.fail(e)
  except (split_execution.WorkerLostError,  # Checkpointed: rerun resumes.
          run_records.RunRecordError) as e:  # Damaged records, full disk.
    cli.fail(e)
    return 1
  print(program.format_summary(summary))
  print(f'outputs: {config.output_dir}/ (metrics.csv, releases.jsonl, '
        'ledger.json, summary.json, plot.png, tensorboard/, checkpoints/)')
  return 0


def interrupted() -> str:
  """What a Ctrl-C prints: where a rerun of the same command goes on.

  Read from the run directory, as the rerun will read it: it resumes after
  the newest checkpoint (a DP run saves each round's before releasing it).
  """
  from tff_clip import run_records  # pylint: disable=g-import-not-at-top
  config = config_from_flags()
  out = config.output_dir
  if not os.path.exists(os.path.join(out, 'config.json')):
    return 'rerun the same command to start the run'
  if os.path.exists(os.path.join(out, 'summary.json')):
    return 'the run had finished; rerun the same command to see its results'
  versions = run_records.Checkpoints(os.path.join(out, 'checkpoints')
                                     ).versions()
  next_round = (versions[-1] if versions else 0) + 1
  if next_round > config.rounds:
    return (f'all {config.rounds} rounds are trained; rerun the same command '
            'to finish (ledger, summary, plot)')
  return f'rerun the same command to resume from round {next_round}'


define_flags()

if __name__ == '__main__':
  cli.run(main, interrupted=interrupted)
