"""The BUILD files and pyproject.toml tell the truth about the code.

Bazel is not installed here (and there is no WORKSPACE/MODULE file), so the
BUILD files are checked by reading them: Starlark's BUILD dialect is Python
syntax, so `ast` parses it. What is checked:

- Every label names a target that exists: `:name` in the same BUILD file,
  `//pkg:name` or `//pkg` in `pkg/BUILD`. External labels (`@...`) cannot be
  resolved without a module file and are refused.
- Every `srcs` / `main` file exists, and every Python file of `tff_clip/`,
  `tasks/`, `scripts/` and `tests/` is in the `srcs` of exactly one target
  (the shared pytest runner `tests/pytest_main.py` excepted).
- The `deps` of each target are exactly the targets owning the project
  modules its sources import (`import tasks`, `from tff_clip.aggregation import dp`, also
  inside functions) or name as a dotted string ('scripts.train' run with
  `python -m`, 'tasks.registry' imported lazily), plus a package's
  `__init__.py` target when the module is imported from outside the package
  (Python runs it first).
- Every `py_test` has its test file in `srcs` and the pytest runner as
  `main`, which runs that file (`args`); every `py_binary` its script as
  `main`.
- pyproject.toml declares every third-party distribution that `tff_clip`
  imports.
"""

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ('tff_clip', 'tasks', 'scripts')
SOURCE_DIRS = PROJECT_PACKAGES + ('tests',)
RUNNER = 'tests/pytest_main.py'
RULES = ('py_library', 'py_binary', 'py_test')
OTHER_CALLS = ('load', 'package', 'licenses', 'exports_files')
CONFTEST = 'tests/conftest.py'  # pytest loads it for every test.


def _build_files():
  return sorted([ROOT / 'BUILD'] +
                [ROOT / d / 'BUILD' for d in SOURCE_DIRS
                 if (ROOT / d / 'BUILD').exists()])


def _parse_build(path):
  """Yields (rule, attributes) for every rule call of one BUILD file."""
  for statement in ast.parse(path.read_text(), str(path)).body:
    assert isinstance(statement, ast.Expr) and isinstance(
        statement.value, ast.Call), f'{path}: only calls expected'
    call = statement.value
    rule = call.func.id
    assert rule in RULES + OTHER_CALLS, f'{path}: unknown rule {rule}'
    if rule in RULES:
      yield rule, {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def _targets():
  """{(package, name): (rule, attributes)} over all BUILD files."""
  targets = {}
  for path in _build_files():
    package = path.parent.relative_to(ROOT).as_posix()
    package = '' if package == '.' else package
    for rule, attributes in _parse_build(path):
      key = (package, attributes['name'])
      assert key not in targets, f'duplicate target {key}'
      targets[key] = (rule, attributes)
  return targets


TARGETS = _targets()


def _resolve(label, package):
  """(package, name) of a label, or raises naming it."""
  if label.startswith(':'):
    key = (package, label[1:])
  elif label.startswith('//'):
    pkg, _, name = label[2:].partition(':')
    key = (pkg, name or pkg.rsplit('/', 1)[-1])
  else:
    raise AssertionError(f'label {label!r} in //{package}: only ":name" and '
                         '"//pkg:name" labels can be checked (no module file)')
  if key not in TARGETS:
    raise AssertionError(f'label {label!r} in //{package} points nowhere')
  return key


def _file(package, src):
  return (pathlib.PurePosixPath(package) / src).as_posix()


def _owners():
  owners = {}
  for key, (_, attributes) in TARGETS.items():
    for src in attributes.get('srcs', []):
      owners.setdefault(_file(key[0], src), []).append(key)
  return owners


OWNERS = _owners()


def _project_files():
  return sorted(p.relative_to(ROOT).as_posix() for d in SOURCE_DIRS
                for p in (ROOT / d).rglob('*.py')
                if '__pycache__' not in p.parts)


def _module_file(dotted):
  """The project file of a dotted module name, or None."""
  parts = dotted.split('.')
  if len(parts) == 1 and (ROOT / 'tests' / f'{dotted}.py').exists():
    return f'tests/{dotted}.py'  # tests/ is on sys.path under pytest.
  if parts[0] not in PROJECT_PACKAGES:
    return None
  for candidate in ('/'.join(parts) + '.py', '/'.join(parts) + '/__init__.py'):
    if (ROOT / candidate).exists():
      return candidate
  return None


def _referenced_files(path):
  """Project files that `path` imports or names as a dotted module string."""
  tree = ast.parse((ROOT / path).read_text(), path)
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      # `from tff_clip.aggregation import dp`: dp is a module; `from tasks import Task`:
      # the package itself.
      names += [f'{node.module}.{alias.name}' if _module_file(
          f'{node.module}.{alias.name}') else node.module
                for alias in node.names]
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      if re.fullmatch(r'(tff_clip|tasks|scripts)(\.\w+)+', node.value):
        names.append(node.value)
  files = set()
  for name in names:
    module = _module_file(name)
    if module is None:
      continue
    files.add(module)
    parts = name.split('.')
    for depth in range(1, len(parts)):
      package = '/'.join(parts[:depth])
      if (ROOT / package / '__init__.py').exists() and not path.startswith(
          package + '/'):
        # Python runs each enclosing package's __init__.py first.
        files.add(f'{package}/__init__.py')
  files.discard(path)
  return files


def _third_party_imports(path):
  tree = ast.parse((ROOT / path).read_text(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (alias.name.split('.')[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.module.split('.')[0]


# ----------------------------------------------------------------------------


@pytest.mark.parametrize('key', sorted(TARGETS), ids=lambda k: f'//{k[0]}:{k[1]}')
def test_every_label_points_to_a_target(key):
  _, attributes = TARGETS[key]
  for label in attributes.get('deps', []):
    _resolve(label, key[0])
  for label in attributes.get('data', []):  # A target or a file.
    package, _, name = (label[2:] if label.startswith('//') else
                        f'{key[0]}:{label[1:]}').partition(':')
    if not (ROOT / package / name).is_file():
      _resolve(label, key[0])


@pytest.mark.parametrize('key', sorted(TARGETS), ids=lambda k: f'//{k[0]}:{k[1]}')
def test_every_source_file_exists(key):
  _, attributes = TARGETS[key]
  for src in attributes.get('srcs', []) + [attributes.get('main', '')]:
    if src:
      assert (ROOT / _file(key[0], src)).is_file(), (
          f'//{key[0]}:{key[1]} names missing file {src}')


def test_every_python_file_belongs_to_exactly_one_target():
  problems = []
  for path in _project_files():
    owners = OWNERS.get(path, [])
    if path == RUNNER:
      continue
    if len(owners) != 1:
      problems.append(f'{path}: in the srcs of {owners or "no target"}')
  assert not problems, '\n'.join(problems)


@pytest.mark.parametrize('key', sorted(TARGETS), ids=lambda k: f'//{k[0]}:{k[1]}')
def test_deps_are_exactly_the_imported_project_modules(key):
  _, attributes = TARGETS[key]
  wanted = set()
  for src in attributes.get('srcs', []):
    path = _file(key[0], src)
    if path == RUNNER:
      continue
    for module in _referenced_files(path):
      owners = OWNERS.get(module)
      assert owners, f'{path} imports {module}, which no target owns'
      wanted.update(o for o in owners if o != key)
  if TARGETS[key][0] == 'py_test':
    wanted.update(OWNERS[CONFTEST])
  declared = {_resolve(label, key[0]) for label in attributes.get('deps', [])}
  show = lambda keys: sorted(
      f':{n}' if p == key[0] else f'//{p}:{n}' for p, n in keys)
  assert declared == wanted, (
      f'//{key[0]}:{key[1]} deps: missing {show(wanted - declared)}, '
      f'not imported {show(declared - wanted)}')


@pytest.mark.parametrize('key', sorted(TARGETS), ids=lambda k: f'//{k[0]}:{k[1]}')
def test_tests_and_binaries_have_a_main_that_runs_them(key):
  rule, attributes = TARGETS[key]
  srcs = [_file(key[0], s) for s in attributes.get('srcs', [])]
  if rule == 'py_test':
    test_files = [s for s in srcs if s != RUNNER]
    assert len(test_files) == 1 and re.fullmatch(r'tests/test_\w+\.py',
                                                 test_files[0]), srcs
    assert _file(key[0], attributes.get('main', '')) == RUNNER
    assert RUNNER in srcs
    assert attributes.get('args') == [test_files[0]]
  elif rule == 'py_binary':
    assert len(srcs) == 1 and _file(key[0], attributes.get('main', '')) == (
        srcs[0])


def test_every_test_file_has_a_py_test():
  tested = {_file(k[0], s) for k, (rule, a) in TARGETS.items()
            if rule == 'py_test' for s in a['srcs']}
  missing = [p for p in _project_files()
             if re.fullmatch(r'tests/test_\w+\.py', p) and p not in tested]
  assert not missing


# The training program's modules: they may also import the `program` extra.
PROGRAM_MODULES = ('tff_clip/program/training.py', 'tff_clip/program/plotting.py')


def _names(requirements):
  return {re.split(r'[\[<>=!~; ]', r, 1)[0].lower().replace('_', '-')
          for r in requirements}


def test_pyproject_declares_every_third_party_import_of_tff_clip():
  project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
  library = _names(project['dependencies'])
  program = library | _names(project['optional-dependencies']['program'])
  distributions = importlib.metadata.packages_distributions()
  undeclared = set()
  for path in _project_files():
    if not path.startswith('tff_clip/'):
      continue
    for name in _third_party_imports(path):
      if name in sys.stdlib_module_names or name in PROJECT_PACKAGES:
        continue
      dists = {d.lower().replace('_', '-')
               for d in distributions.get(name, [name])}
      declared = program if path in PROGRAM_MODULES else library
      if not dists & declared:
        undeclared.add(f'{name} ({path}: {sorted(dists)})')
  assert not undeclared, sorted(undeclared)


def _expected_deps(path):
  """The deps labels (as seen from `path`'s own BUILD package) `path` needs."""
  package = 'tasks' if path.startswith('tasks/') else ''
  owners = set()
  for module in _referenced_files(path):
    owners.update(OWNERS.get(module, [('?', module)]))
  if re.fullmatch(r'tests/test_\w+\.py', path):
    owners.update(OWNERS[CONFTEST])
  owners -= set(OWNERS.get(path, []))
  return sorted(f':{n}' if p == package else f'//{p}:{n}' for p, n in owners)


if __name__ == '__main__':
  # `python tests/test_build_file.py tff_clip/new_module.py ...` prints the
  # deps each file's target needs ('//?:file' marks a module without target).
  for argument in sys.argv[1:]:
    print(argument, _expected_deps(argument))


# The library's subsystems, lowest first, and the root modules every one of
# them may use. A module imports from its own folder, the folders below it
# and the root modules; a root module imports no subsystem.
SUBSYSTEMS = ('aggregation', 'privacy', 'learning', 'runtime', 'program')
ROOT_MODULES = ('tff_clip/__init__.py', 'tff_clip/names.py', 'tff_clip/checks.py')


def _subsystem(path):
  parts = path.split('/')
  return parts[1] if parts[0] == 'tff_clip' and len(parts) == 3 else None


def test_no_subsystem_imports_from_a_folder_above_it():
  upward = []
  for path in _project_files():
    if path.startswith('tff_clip/'):
      level = (-1 if path in ROOT_MODULES else
               SUBSYSTEMS.index(_subsystem(path)) if _subsystem(path) else None)
      if level is None:
        continue  # Loose: the next test refuses it.
      for module in _referenced_files(path):
        other = _subsystem(module)
        if other and SUBSYSTEMS.index(other) > level:
          upward.append(f'{path} imports {module}')
  assert not upward, '\n'.join(upward)


def test_every_library_module_sits_in_a_subsystem_folder():
  """Nothing at the package root but the root modules: no module there
  only re-exports another."""
  loose = [p for p in _project_files() if p.startswith('tff_clip/') and
           p.count('/') == 1 and p not in ROOT_MODULES]
  assert not loose, loose


def test_no_library_file_is_above_600_lines():
  long = {p: n for p in _project_files() if p.startswith('tff_clip/')
          for n in [len((ROOT / p).read_text().splitlines())] if n > 600}
  assert not long, long
