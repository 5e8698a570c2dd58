"""The install route docs/packaging.md gives works as written, in a fresh venv.

The `sh` block under "Installing into another project" is ONE pip command
(after the venv it runs in): `requirements-library.txt` with `--no-deps`,
then tff_clip itself. The default suite checks the file against the
installed metadata of this environment (an independent account of what each
package needs): closed, at requirements.txt's versions, nothing test-only.
The slow test runs the block line by line in an empty directory,
`/path/to/tff_clip` standing for this checkout, then imports and uses the
installed library from that directory (not the checkout). Slow: it installs
the whole environment (4-5 minutes here).
"""

import importlib.metadata
import re
import subprocess

import pytest
from packaging import markers
from packaging import requirements

import as_a_user  # pylint: disable=g-bad-import-order

PAGE = (as_a_user.REPO / 'docs' / 'packaging.md').read_text()
LIBRARY = as_a_user.REPO / 'requirements-library.txt'
TESTED = as_a_user.REPO / 'requirements.txt'
# Test tools and their own needs: never in another project's environment.
TEST_ONLY = {'pytest', 'pytest-xdist', 'execnet', 'iniconfig', 'pluggy',
             'hypothesis', 'sortedcontainers', 'optax', 'chex', 'toolz'}
# TFF's declared jax==0.4.14 is not served; 0.4.13 stands in (the file's
# comment, docs/packaging.md).
JAX_PIN = {'jax', 'jaxlib'}
# What `python3.11 -m venv` puts in every environment (setuptools 65.5).
IN_EVERY_VENV = {'setuptools', 'pip'}


def _name(text):
  return re.sub(r'[-_.]+', '-', text).lower()


def _pins(path):
  pins = {}
  for line in path.read_text().splitlines():
    line = line.split('#')[0].strip()
    if line:
      name, version = line.split('==')
      pins[_name(name)] = version.strip()
  return pins


def _route():
  section = PAGE.split('## Installing into another project', 1)[1]
  return re.search(r'```sh\n(.*?)```', section, flags=re.S).group(1)


def test_the_route_is_one_pip_command_after_the_venv():
  lines = _route().strip().splitlines()
  assert len(lines) == 2 and lines[0].startswith('python3.11 -m venv ')
  assert lines[1] == ('env/bin/pip install --no-deps -r '
                      '/path/to/tff_clip/requirements-library.txt '
                      '/path/to/tff_clip')


def test_library_requirements_hold_no_test_only_package():
  assert not TEST_ONLY & set(_pins(LIBRARY))
  assert TEST_ONLY <= set(_pins(TESTED)) | {'sortedcontainers'}


def test_library_requirements_pin_the_tested_versions():
  library, tested = _pins(LIBRARY), _pins(TESTED)
  assert library.pop('tensorflow-federated') == '0.87.0'
  # wheel: astunparse's need, which requirements.txt leaves to pip's venv.
  library.pop('wheel')
  assert {name: tested.get(name) for name in library} == library


def test_library_requirements_are_closed_under_declared_dependencies():
  """Every requirement (no extra) of every listed package is listed, and
  satisfied by its pin -- jax's excepted (TFF pins an unserved release)."""
  pins = _pins(LIBRARY)
  environment = markers.default_environment()
  missing, unsatisfied = [], []
  for name, version in pins.items():
    assert importlib.metadata.version(name) == version or name == 'wheel', name
    for text in importlib.metadata.requires(name) or []:
      requirement = requirements.Requirement(text)
      if requirement.marker and not requirement.marker.evaluate(
          {**environment, 'extra': ''}):
        continue
      needed = _name(requirement.name)
      if needed not in pins and needed not in IN_EVERY_VENV:
        missing.append(f'{name} needs {requirement}')
      elif (needed in pins and needed not in JAX_PIN and not requirement.specifier.contains(
          pins[needed], prereleases=True)):
        unsatisfied.append(f'{name} needs {requirement}')
  assert not missing and not unsatisfied, (missing, unsatisfied)


def test_library_requirements_cover_what_tff_clip_declares():
  import tomllib  # pylint: disable=g-import-not-at-top
  project = tomllib.loads(
      (as_a_user.REPO / 'pyproject.toml').read_text())['project']
  declared = [*project['dependencies'],
              *project['optional-dependencies']['program']]
  pins = _pins(LIBRARY)
  for text in declared:
    requirement = requirements.Requirement(text)
    assert requirement.specifier.contains(pins[_name(requirement.name)]), text


def _outside_env():
  """Another project's shell: no PYTHONPATH pointing into this checkout."""
  env = as_a_user.env(TF_CPP_MIN_LOG_LEVEL='3')
  env.pop('PYTHONPATH', None)
  return env


@pytest.mark.slow
def test_documented_install_route_works_in_a_fresh_environment(tmp_path):
  for line in _route().strip().splitlines():
    command = line.replace('/path/to/tff_clip', str(as_a_user.REPO))
    result = subprocess.run(command, shell=True, cwd=tmp_path,
                            capture_output=True, text=True, timeout=1800,
                            check=False, env=_outside_env())
    assert result.returncode == 0, (line, result.stderr[-3000:])
  pip = str(tmp_path / 'env/bin/pip')
  installed = subprocess.run([pip, 'list', '--format=freeze'],
                             capture_output=True, text=True, check=True)
  names = {_name(line.split('==')[0]) for line in installed.stdout.split()}
  assert not names & TEST_ONLY, names & TEST_ONLY
  check = subprocess.run([pip, 'check'], capture_output=True, text=True,
                         check=False)
  # The jax pin, and nothing else (docs/packaging.md quotes these lines).
  assert sorted(check.stdout.splitlines()) == sorted(
      line.strip() for line in PAGE.splitlines()
      if line.strip().startswith('tensorflow-federated 0.87.0 has requirement'))
  use = ('from tff_clip.aggregation import dp; from tff_clip.privacy import accounting; '
         'import tff_clip, tff_clip.program.training; '
         'f = dp.dp_factory("clip", noise_multiplier=1.0, '
         'clients_per_round=10, clip_norm=1.0); '
         'print(tff_clip.__file__); '
         'print(accounting.compute_training_epsilon(1.0, 10, 1000, 10, 1e-5)'
         '.epsilon > 0)')
  result = subprocess.run([str(tmp_path / 'env/bin/python'), '-c', use],
                          cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, check=False,
                          env=_outside_env())
  assert result.returncode == 0, result.stderr[-3000:]
  where, answer = result.stdout.split()[-2:]
  assert where.startswith(str(tmp_path / 'env')), where  # Not the checkout.
  assert answer == 'True'
  assert 'Traceback' not in result.stderr
