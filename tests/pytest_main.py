"""The `main` of every Bazel `py_test`: runs pytest on the files in argv.

`bazel test //:bounding_test` runs `tests/pytest_main.py tests/test_bounding.py`
(the target's `args`), so the test file's tests actually run and their result
is the target's exit status.
"""

import sys

import pytest

if __name__ == '__main__':
  sys.exit(pytest.main(sys.argv[1:]))
