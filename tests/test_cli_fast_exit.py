"""A script that opts in to `cli.run(..., fast_exit=True)` skips the
interpreter's teardown, never what an ordinary exit writes."""

import as_a_user  # pylint: disable=g-bad-import-order

SCRIPT = '''
import atexit, sys
from scripts import cli

class Writer:
  """Writes its line when freed, as a file writer flushes on close."""
  def __init__(self, path):
    self.path, self.cycle = path, self  # Freed only by the collector.
  def __del__(self):
    with open(self.path, 'a') as f:
      f.write('freed\\n')

def main(argv):
  Writer(argv[1])
  atexit.register(lambda: open(argv[1], 'a').write('atexit\\n'))
  sys.stdout.write('unflushed output')  # No newline, no flush.
  return {code}

cli.run(main, fast_exit=True)
'''


def _run(tmp_path, code):
  path = tmp_path / 'written.txt'
  proc = as_a_user.start(['-c', SCRIPT.format(code=code), str(path)])
  output, _ = proc.communicate(timeout=60)
  return proc.returncode, output, path.read_text()


def test_a_fast_exit_keeps_the_exit_code_output_hooks_and_finalizers(
    tmp_path):
  returncode, output, written = _run(tmp_path, 3)
  assert returncode == 3
  assert output == 'unflushed output'
  assert written == 'freed\natexit\n'


def test_a_fast_exit_of_a_main_returning_none_is_exit_code_0(tmp_path):
  returncode, _, _ = _run(tmp_path, None)
  assert returncode == 0
