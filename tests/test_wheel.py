"""Specification of the installed library: the wheel works without the checkout.

The wheel is built from this checkout and installed on its own into a fresh
virtual environment whose third-party packages are those of the tested
environment (`requirements.txt`, the environment running these tests, linked
in as a plain path: its editable install of `tff_clip` is not seen). Python
runs isolated (`-I`) from a directory outside the checkout, so neither
`tasks`, `scripts` nor the checkout's `tff_clip` can be imported by accident.
There, every module of the wheel imports and README's library snippet runs.
"""

import pathlib
import re
import subprocess
import sys
import sysconfig
import venv
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def wheel_env(tmp_path_factory):
  """(python executable, wheel path, working directory outside the checkout)."""
  root = tmp_path_factory.mktemp('wheel')
  subprocess.run(
      [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
       '-q', '-w', str(root / 'dist'), str(REPO)],
      check=True, capture_output=True, timeout=300)
  wheel, = (root / 'dist').glob('tff_clip-*.whl')
  env_dir = root / 'venv'
  venv.EnvBuilder(with_pip=False).create(env_dir)
  python = env_dir / 'bin' / 'python'
  site = subprocess.run(
      [str(python), '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
      check=True, capture_output=True, text=True).stdout.strip()
  # The tested third-party packages, as a path (not a site directory, so the
  # editable install's .pth hook in it is not run).
  pathlib.Path(site, 'tested_packages.pth').write_text(
      sysconfig.get_paths()['purelib'] + '\n')
  with zipfile.ZipFile(wheel) as archive:
    archive.extractall(site)  # What `pip install --no-deps` puts there.
  work = root / 'work'
  work.mkdir()
  return python, wheel, work


def _run(python, work, code):
  return subprocess.run([str(python), '-I', '-c', code], cwd=work,
                        capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_wheel_holds_the_library_only(wheel_env):
  _, wheel, _ = wheel_env
  with zipfile.ZipFile(wheel) as archive:
    top = {name.split('/')[0] for name in archive.namelist()}
  assert top == {'tff_clip', 'tff_clip-0.1.0.dist-info'}


@pytest.mark.slow
def test_every_module_of_the_wheel_imports_without_the_checkout(wheel_env):
  python, wheel, work = wheel_env
  with zipfile.ZipFile(wheel) as archive:
    modules = sorted(name[:-3].replace('/', '.') for name in archive.namelist()
                     if name.startswith('tff_clip/') and name.endswith('.py'))
  assert {'dp', 'spec', 'training'} <= {m.split('.')[-1] for m in modules}
  code = (
      'import importlib, sys\n'
      f'for name in {modules!r}:\n'
      '  importlib.import_module(name.removesuffix(".__init__"))\n'
      'import tff_clip\n'
      'assert "site-packages" in tff_clip.__file__, tff_clip.__file__\n'
      'for name in ("tasks", "scripts"):\n'
      '  assert name not in sys.modules, name\n'
      'print("ok", len(sys.modules))\n')
  result = _run(python, work, code)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.startswith('ok')


@pytest.mark.slow
def test_readme_library_snippet_runs_on_a_tff_task_from_the_wheel(wheel_env):
  python, _, work = wheel_env
  readme = (REPO / 'README.md').read_text()
  snippet, = [s for s in re.findall(r'```python\n(.*?)```', readme, re.S)
              if 'dp.dp_factory' in s]
  assert 'import tasks' not in snippet  # A TFF task, not this repository's.
  result = _run(python, work, snippet)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'clip_norm' in result.stdout  # The adaptive clip norm's metric.
