"""Specification of `scripts.train`'s command line as a user meets it.

* Each command has a run directory of its own: the default
  `--experiment_name` is `task_bounding[_dp]_seedN`, followed by a hash of
  the other flags that differ from their defaults; the same command finds
  its run again, and an explicit `--experiment_name` is used as given.
* One vocabulary: the flags are `TrainConfig`'s fields and `dp_factory`'s
  arguments; TFF's and federated_research's names are aliases.
* `--help` describes the real defaults; a refusal is one line naming the one
  thing wrong, exit code 2, nothing written.

The program's flags live in absl's global registry, so every check runs
`scripts.train` in a process of its own, as a user does.
"""

import dataclasses
import inspect
import json

import pytest

from tasks import names as task_names
from tff_clip.aggregation import dp
from tff_clip.program import config as config_lib
import as_a_user  # pylint: disable=g-bad-import-order

# Prints the configuration `scripts.train` builds from each command line (a
# JSON list of argument lists on stdin): one JSON object a line.
_CONFIGS = '''
import json, sys
from scripts import train
for argv in json.load(sys.stdin):
  train.FLAGS.unparse_flags()
  train.FLAGS(['scripts.train', *argv])
  config = train.config_from_flags()
  print(json.dumps(dict(config.to_json(), output_dir=config.output_dir)))
'''


def _configs(*commands):
  """The configurations `scripts.train` builds from `commands`."""
  proc = as_a_user.run(['-c', _CONFIGS], stdin_text=json.dumps(commands),
                       timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope='module')
def configs():
  """`configs(*commands)`: `_configs`, every command of this file built at
  once, in one process (one start-up, not one a test)."""
  commands = [list(c) for c in _COMMANDS]
  built = dict(zip(map(tuple, commands), _configs(*commands)))
  return lambda *asked: [built[tuple(c)] for c in asked]


# ----------------------------------------------------------------------------
# Run directories.

# The `scripts.train` commands of README and docs/ a reader runs one after
# the other in one checkout (README's main command has no flags).
DOCUMENTED = {
    'README.md': [],
    'docs/audit.md': ['--audit_canaries=50', '--clip_norm=0.2'],
    'docs/correlated_noise.md': [
        '--task=digits', '--sampling=min_separation',
        '--noise_mechanism=banded', '--bands=4', '--noise_multiplier=1.0',
        '--clients_per_round=9', '--rounds=8'],
    'docs/correlated_noise.md, audited': [
        '--task=digits', '--sampling=min_separation',
        '--noise_mechanism=banded', '--bands=4', '--noise_multiplier=1.0',
        '--clients_per_round=9', '--rounds=20', '--audit_canaries=100'],
    'docs/execution.md': ['--executor=local', '--rounds=10'],
}


AUDIT = DOCUMENTED['docs/audit.md']
# The audit command again, as the same run.
SAME_AS_AUDIT = [AUDIT[::-1],  # Flags in another order,
                 AUDIT + ['--rounds=30'],  # a default said explicitly,
                 AUDIT + ['--executor=local', '--progress=false'],  # executed
                 ['--audit_canaries=50', '--clip_norm=0.20']]  # elsewhere.
AUDIT_SEED_1 = AUDIT + ['--seed=1']
NAMED = ['--clip_norm=0.2', '--experiment_name=mine']


def test_the_command_without_flags_writes_where_readme_says(configs):
  config, = configs([])
  assert config['output_dir'] == 'runs/digits_noise_following_dp_seed0'


def test_documented_commands_get_a_directory_each(configs):
  directories = [c['output_dir'] for c in configs(*DOCUMENTED.values())]
  assert len(set(directories)) == len(DOCUMENTED), dict(
      zip(DOCUMENTED, directories))
  # The name still says what the run is.
  assert all(d.startswith('runs/digits_noise_following_dp_seed0') for d in
             directories)


def test_the_same_run_finds_its_directory_again(configs):
  directories = {c['output_dir'] for c in configs(AUDIT, *SAME_AS_AUDIT)}
  assert len(directories) == 1, directories
  other_seed, = configs(AUDIT_SEED_1)
  assert other_seed['output_dir'] == directories.pop().replace('seed0',
                                                                'seed1')


def test_an_explicit_experiment_name_is_used_as_given(configs):
  config, = configs(NAMED)
  assert config['output_dir'] == 'runs/mine'


# ----------------------------------------------------------------------------
# One vocabulary; TFF's names accepted.

# federated_research's trainer flags and TFF's `gaussian_adaptive`
# arguments -> the name the flags, `TrainConfig` and `dp_factory` use.
ALIASES = {
    '--total_rounds=7': '--rounds=7',
    '--client_batch_size=4': '--batch_size=4',
    '--client_epochs_per_round=2': '--local_epochs=2',
    '--rounds_per_eval=3': '--eval_every=3',
    '--target_unclipped_quantile=0.5': '--target_quantile=0.5',
    '--initial_l2_norm_clip=0.05': '--initial_clip_norm=0.05',
    '--adaptive_clip_learning_rate=0.3': '--clip_learning_rate=0.3',
}


def test_tff_and_federated_research_names_are_aliases(configs):
  with_aliases, with_names = configs(list(ALIASES), list(ALIASES.values()))
  assert with_aliases == with_names
  assert with_names['rounds'] == 7 and with_names['target_quantile'] == 0.5


def test_dp_factory_arguments_are_flags_of_the_same_name():
  fields = {f.name: f.default for f in dataclasses.fields(
      config_lib.TrainConfig)}
  parameters = inspect.signature(dp.dp_factory).parameters
  for parameter in parameters.values():
    # A Python object, and the factory's kind (which fed_avg it drops into,
    # the program's own choice): not DP quantities.
    if parameter.kind == parameter.KEYWORD_ONLY and parameter.name not in (
        'record_aggregation_factory', 'weighted'):
      assert parameter.name in fields, parameter.name
  # The bounding's knobs have the same defaults too.
  for name in ('clip_norm', 'split', 'initial_clip_norm', 'target_quantile',
               'clip_learning_rate', 'clipped_count_stddev',
               'per_layer_quantiles', 'denominator', 'noise_placement'):
    assert fields[name] == parameters[name].default, name


# Every command line above, built by the `configs` fixture.
_COMMANDS = [*DOCUMENTED.values(), *SAME_AS_AUDIT, AUDIT_SEED_1, NAMED,
             list(ALIASES), list(ALIASES.values())]


# ----------------------------------------------------------------------------
# What --help and a refusal say.


def test_help_describes_the_real_defaults_and_every_task():
  proc = as_a_user.run(['-m', 'scripts.train', '--help'], timeout=120)
  assert proc.returncode == 0
  defaults = config_lib.TrainConfig()
  introduction = proc.stdout.split('__main__:')[0]
  assert f'--bounding={defaults.bounding}' in introduction
  assert f'--clip_norm={defaults.clip_norm}' in introduction
  assert f'{defaults.rounds} rounds' in introduction
  assert 'adaptive clipping' not in introduction  # The default normalizes.
  assert '--help' not in introduction  # It is what the reader is reading.
  for alias in ALIASES:
    assert alias.split('=')[0] + ': Alias for' in proc.stdout
  task_help = proc.stdout.split('--task:')[1].split('\n  --')[0]
  for name in task_names.TASK_NAMES:
    assert name in task_help


def _refusal(tmp_path, *args):
  """The one line `scripts.train *args` refuses with; nothing is written."""
  runs = tmp_path / 'runs'
  return as_a_user.refusal(as_a_user.run(
      ['-m', 'scripts.train', f'--root_output_dir={runs}', *args],
      timeout=120), runs)


def test_noise_multiplier_with_target_epsilon_names_both_and_keeps_one(
    tmp_path):
  line = _refusal(tmp_path, '--target_epsilon=8', '--noise_multiplier=1')
  assert line == ('error: --noise_multiplier=1.0 and --target_epsilon=8.0 '
                  'both set the noise: give one of them (--target_epsilon '
                  'calibrates the noise multiplier).')


def test_an_unknown_task_is_refused_with_the_task_names(tmp_path):
  line = _refusal(tmp_path, '--task=emnist')
  assert line.startswith('error: --task must be one of ')
  assert line.endswith("; got 'emnist'.")
  for name in task_names.TASK_NAMES:
    assert name in line


@pytest.mark.slow  # It imports TensorFlow to build the task.
def test_missing_task_data_is_one_line_saying_where_it_belongs(tmp_path):
  # The offline Shakespeare text lives outside the checkout (docs/tasks.md).
  line = as_a_user.refusal(as_a_user.run(
      ['-m', 'scripts.train', '--task=shakespeare',
       f'--root_output_dir={tmp_path / "runs"}'], timeout=600,
      TFF_CLIP_SHARED_DATA=str(tmp_path / 'nowhere')), tmp_path / 'runs')
  assert 'tinyshakespeare.txt' in line and 'TFF_CLIP_SHARED_DATA' in line


# Runs `scripts.train`'s `main` with argv[1:] up to the training, counting
# the configurations validated: `training.run` stands in for the training
# and prints how many `config.validate` checked (it imports no TensorFlow).
_VALIDATIONS = '''
import sys
from scripts import train
from tff_clip.program import config as config_lib
from tff_clip.program import training
checked = []
validate = config_lib.validate
def counted(config):
  checked.append(config)
  validate(config)
config_lib.validate = counted
def stand_in(config, task_builder, release_managers=(), *, validated=False):
  if not validated:
    training.validate(config)
  print(len(checked), validated, 'tensorflow' in sys.modules)
  raise SystemExit(0)
training.run = stand_in
train.FLAGS(['scripts.train', *sys.argv[1:]])
train.main(['scripts.train'])
'''


@pytest.mark.parametrize('noise', ['--noise_multiplier=0.5',
                                   '--target_epsilon=8'])
def test_a_command_validates_its_configuration_once(tmp_path, noise):
  """`scripts.train` checks its flags before TensorFlow loads, and the
  training it hands them to does not check them again (a calibrated
  --target_epsilon's noise is checked as the mechanism, not as a second
  configuration)."""
  proc = as_a_user.run(['-c', _VALIDATIONS, noise,
                        f'--root_output_dir={tmp_path / "runs"}'],
                       timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ['1', 'True', 'False']
