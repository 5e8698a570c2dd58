"""The install route docs/packaging.md gives works as written, in a fresh venv.

The `sh` block under "Installing into another project" is run line by line
in an empty directory, `/path/to/tff_clip` standing for this checkout; then
the installed library is imported and used from that directory (not the
checkout), with no TensorFlow or TFF traceback. Slow: it installs the whole
pinned environment (a few minutes with pip's cache, more without).
"""

import re
import subprocess

import pytest

import as_a_user  # pylint: disable=g-bad-import-order

PAGE = (as_a_user.REPO / 'docs' / 'packaging.md').read_text()


def _route():
  section = PAGE.split('## Installing into another project', 1)[1]
  return re.search(r'```sh\n(.*?)```', section, flags=re.S).group(1)


def test_the_route_is_documented_with_no_deps():
  lines = _route().strip().splitlines()
  assert lines[-1].endswith('--no-deps -e /path/to/tff_clip')
  assert any('--no-deps tensorflow-federated==0.87.0' in l for l in lines)


@pytest.mark.slow
def test_documented_install_route_works_in_a_fresh_environment(tmp_path):
  for line in _route().strip().splitlines():
    command = line.replace('/path/to/tff_clip', str(as_a_user.REPO))
    result = subprocess.run(command, shell=True, cwd=tmp_path,
                            capture_output=True, text=True, timeout=1800,
                            check=False)
    assert result.returncode == 0, (line, result.stderr[-3000:])
  use = ('from tff_clip.aggregation import dp; from tff_clip.privacy import accounting; '
         'f = dp.dp_factory("clip", noise_multiplier=1.0, '
         'clients_per_round=10, clip_norm=1.0); '
         'print(accounting.compute_training_epsilon(1.0, 10, 1000, 10, 1e-5)'
         '.epsilon > 0)')
  result = subprocess.run([str(tmp_path / 'env/bin/python'), '-c', use],
                          cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, check=False,
                          env=as_a_user.env(TF_CPP_MIN_LOG_LEVEL='3'))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith('True')
  assert 'Traceback' not in result.stderr
