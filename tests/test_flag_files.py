"""The benchmark settings as absl flag files (`scripts/flags/`).

Each setting (EMNIST, Shakespeare, Stack Overflow) has a file that, alone,
is that setting on its real data (`--data_source=online`), and
a `_smoke` file that, after it, runs the same setting offline at a size the
offline stand-in has (its clients, from docs/tasks.md's table: an
independent count, which the slow suite checks against the tasks). Both
parse and validate as `scripts.train` does; docs/training.md gives each
pair as commands, and the slow test runs the smoke commands as written.
"""

import json
import re
import shlex

import pytest

import as_a_user  # pylint: disable=g-bad-import-order

FLAGS_DIR = as_a_user.REPO / 'scripts' / 'flags'
SETTINGS = {'emnist': 'emnist_cnn', 'shakespeare': 'shakespeare',
            'stackoverflow': 'stackoverflow_next_word'}
TRAINING = (as_a_user.REPO / 'docs' / 'training.md').read_text()

# The configuration each argument list gives, as JSON, after validation.
_CONFIGS = """
import json, sys
from scripts import program, train
for argv in json.load(sys.stdin):
  train.FLAGS.unparse_flags()
  train.FLAGS(['scripts.train', *argv])
  config = train.config_from_flags()
  program.validate(config)
  print(json.dumps(config.to_json()))
"""


def _offline_clients(task):
  """The offline stand-in's clients, from docs/tasks.md's table."""
  table = (as_a_user.REPO / 'docs' / 'tasks.md').read_text()
  row = re.search(rf'^\| `{task}` \|.*\| offline: .*\| ([\d,]+) \|$', table,
                  flags=re.M)
  return int(row.group(1).replace(',', ''))


@pytest.fixture(scope='module')
def configs():
  """{(setting, smoke): the TrainConfig's JSON}, in one interpreter."""
  keys = [(name, smoke) for name in SETTINGS for smoke in (False, True)]
  argvs = [[f'--flagfile=scripts/flags/{name}.cfg'] +
           ([f'--flagfile=scripts/flags/{name}_smoke.cfg'] if smoke else [])
           for name, smoke in keys]
  result = as_a_user.run(['-c', _CONFIGS], stdin_text=json.dumps(argvs),
                         timeout=300, TF_CPP_MIN_LOG_LEVEL='3')
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  return dict(zip(keys, map(json.loads, lines), strict=True))


def test_every_setting_has_its_file_and_a_smoke_file():
  # Beside them, README's first run (offline already: no smoke file).
  assert sorted(p.name for p in FLAGS_DIR.glob('*.cfg')) == sorted(
      [f'{name}{kind}.cfg' for name in SETTINGS for kind in ('', '_smoke')] +
      ['digits_demo.cfg'])


@pytest.mark.parametrize('name', SETTINGS)
def test_the_published_file_is_the_setting_on_its_real_data(configs, name):
  config = configs[(name, False)]
  assert config['task'] == SETTINGS[name]
  assert config['data_source'] == 'online'
  assert config['rounds'] >= 1000  # The published length, not a smoke one.
  # EMNIST's and Stack Overflow's cohorts do not fit their offline
  # stand-ins (the smoke file is needed): what docs/training.md says.
  fits_offline = config['clients_per_round'] <= _offline_clients(
      SETTINGS[name])
  assert fits_offline == (name == 'shakespeare')


# The data sets each paper a flag file may cite trained on, from the papers
# (../shared/seeds for Das et al. and Pelikan et al.: synthetic problems,
# MNIST, CIFAR and LibriSpeech; Reddi et al. 2021 and Andrew et al. 2021
# ran all three of these).
TRAINED_ON = {
    'Reddi et al.': {'emnist', 'shakespeare', 'stackoverflow'},
    'Andrew et al.': {'emnist', 'shakespeare', 'stackoverflow'},
    'Das et al.': set(),
    'Pelikan et al.': set(),
}


@pytest.mark.parametrize('name', SETTINGS)
def test_a_file_credits_a_published_setting_only_to_papers_run_on_its_data(
    name):
  lines = (FLAGS_DIR / f'{name}.cfg').read_text().splitlines()
  head = ' '.join(line.lstrip('# ') for line in lines
                  if line.startswith('#'))
  cited = {paper for paper in TRAINED_ON if paper in head}
  assert cited, head  # Every file says where its setting comes from.
  if 'not a published one' in head:
    return
  assert 'the published setting' in head, head
  assert all(name in TRAINED_ON[paper] for paper in cited), (name, cited)


@pytest.mark.parametrize('name', SETTINGS)
def test_the_smoke_file_runs_the_setting_offline_at_a_size_that_fits(
    configs, name):
  published, smoke = configs[(name, False)], configs[(name, True)]
  assert smoke['data_source'] == 'offline'
  assert smoke['clients_per_round'] <= _offline_clients(SETTINGS[name])
  assert smoke['rounds'] <= 2
  # Everything else is the full-size setting's.
  changed = {key for key in published if published[key] != smoke[key]}
  assert changed <= {'data_source', 'clients_per_round', 'rounds',
                     'eval_every', 'local_steps', 'max_concurrent_clients',
                     'experiment_name'}  # The name hashes the flags.


def _documented(name):
  commands = [' '.join(line.split()) for line in TRAINING.splitlines()
              if f'--flagfile=scripts/flags/{name}.cfg' in line]
  return commands


@pytest.mark.parametrize('name', SETTINGS)
def test_training_md_gives_the_published_and_the_smoke_command(name):
  assert _documented(name) == [
      f'.venv/bin/python -m scripts.train --flagfile=scripts/flags/{name}.cfg'
      ' --data_source=online',
      f'.venv/bin/python -m scripts.train --flagfile=scripts/flags/{name}.cfg'
      f' --flagfile=scripts/flags/{name}_smoke.cfg']


@pytest.mark.slow  # Each runs a minute or two.
@pytest.mark.parametrize('name', SETTINGS)
def test_the_smoke_command_runs_as_written(name, tmp_path):
  command = shlex.split(_documented(name)[1])
  result = as_a_user.run([*command[1:], f'--root_output_dir={tmp_path}',
                          '--progress=false'], timeout=900,
                         TF_CPP_MIN_LOG_LEVEL='3')
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  assert 'final eval accuracy' in result.stdout
