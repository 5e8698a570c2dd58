r"""Stack Overflow next-word prediction at its published shape: what the
server holds, writes and spends per round, for each DP noise mechanism.

  .venv/bin/python -m scripts.benchmark_stackoverflow
  .venv/bin/python -m scripts.benchmark_stackoverflow \
      --doc=docs/stackoverflow_shape.md          # and update the doc's table

The shape is the benchmark of Choquette-Choo, McMahan, Rush and Thakurta
(ICML 2023, "Multi-Epoch Matrix Factorization Mechanisms for Private Machine
Learning"): 342,477 users, TFF's next-word LSTM over a 10,000-word
vocabulary (`tasks.models.create_stackoverflow_lstm`, 4,050,748 parameters),
1,000 users a round (1,001 here: every user of the smallest of the equal
groups) with minimum separation b = 342, so that a user takes
part at most k = 6 times in 2,052 rounds. The users are
`tasks.stackoverflow.GeneratedClientData`: each one's sentences are
generated on demand from (seed, user id), so the population is never held.
The sampler (`tff_clip.privacy.sampling`, min_separation) deals the users into
b groups of equal sizes (342,477 users, b = 342: 1,001 or 1,002) and refuses
a cohort larger than the smallest group: the cohort is
min(--clients_per_round, the smallest group), by default the smallest
group, printed with the groups.

Each mechanism (independent, banded with each of --bands, and BLT once the
library registers a 'blt' noise mechanism) is measured in a process of its
own, on this machine's CPU:

  aggregator state  the DP aggregator's state, bytes and x the model's
  server state      the whole state a round carries and a checkpoint holds
                    (model, aggregator, server optimizer momentum)
  peak RSS          of that process over start-up and one full-cohort round
  start-up          interpreter start to the initialized state: imports,
                    the population and its sampler, TFF tracing, the
                    MapReduceForm, `initialize`
  server s/round    one round's server work at the full cohort: the sum of
                    the cohort's updates (`accumulate`, once per user), the
                    server update (noise, mean, server optimizer), the
                    checkpoint a DP round writes before its release, and
                    the records (ledger and epsilon at the run's last
                    round, releases.jsonl, metrics.csv)
  written/round     bytes a DP round writes: the checkpoint of the
                    published run's state, and the records
                    `tff_clip.program.training.run` writes per round besides its
                    checkpoint (releases.jsonl, metrics.csv, TensorBoard),
                    from its write counter on --e2e_clients_per_round users
                    a round
  e2e s/round       seconds per round of `training.run` at that cohort,
                    the users' local training included

The full-cohort server round takes one real user's update (one local step)
and adds it once per user of the cohort: the server's work does not depend
on what the updates hold. A mechanism whose state would not fit in this
machine's memory is refused before anything is built, with one line giving
its memory need (`memory_need`).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

from absl import flags

from scripts import cli

_VOCAB = flags.DEFINE_integer('vocab_size', 10_000, 'Words in the vocabulary.')
_USERS = flags.DEFINE_integer('num_clients', 342_477, 'Users (clients).')
_COHORT = flags.DEFINE_integer(
    'clients_per_round', None, 'Users a round (default: the smallest '
    'minimum-separation group, 1,001 at the published shape: every user of '
    'a round\'s group; the sampler caps a larger one there).')
_SEPARATION = flags.DEFINE_integer('min_separation', 342,
                                   'Minimum separation b (groups).')
_PARTICIPATIONS = flags.DEFINE_integer(
    'participations', 6, 'Participations k per user: the run has k b rounds '
    '(its ledger at the last one is what the records are timed at).')
_MECHANISMS = flags.DEFINE_list(
    'mechanisms', ['independent', 'banded', 'blt'],
    "Noise mechanisms; 'blt' is measured once tff_clip has it.")
_BANDS = flags.DEFINE_list(
    'bands', ['342', '20'], 'Bands of the banded mechanism: one row each (the '
    'published b, and a b that runs here, to scale from).')
_E2E_COHORT = flags.DEFINE_integer(
    'e2e_clients_per_round', 10, 'Users a round of the end-to-end runs.')
_E2E_ROUNDS = flags.DEFINE_integer(
    'e2e_rounds', 2, 'Rounds timed end to end (after one untimed round).')
_SENTENCES = flags.DEFINE_integer(
    'sentences_per_client', 64, 'Sentences a user trains on per round '
    '(batches of 16) in the end-to-end runs.')
_MEMORY = flags.DEFINE_float(
    'memory_gib', None, 'Memory a mechanism may use, GiB (default: what '
    'the machine has available now).')
_DOC = flags.DEFINE_string(
    'doc', '', 'Also write the table into this markdown file, between its '
    f'{"<!-- table -->"} markers.')
_ONE = flags.DEFINE_string('measure_one', '', 'Internal: measure one '
                           'mechanism in this process (JSON to --result).')
_RESULT = flags.DEFINE_string('result', '', 'Internal: where --measure_one '
                              'writes its JSON.')

NOISE_MECHANISMS = ('independent', 'banded', 'blt')
FLOAT_BYTES = 4
# Special tokens of TFF's next-word task with one out-of-vocabulary bucket:
# padding, the bucket, beginning and end of sentence.
SPECIAL_TOKENS = 4
# Model-sized vectors of the server state besides the noise: the model and
# its server momentum (--server_optimizer=sgdm).
MODEL_VECTORS = 2
# Peak memory of a DP round, in bytes per byte of noise state, is the
# library's `preflight.STATE_COPIES_AT_PEAK` (what `scripts.train` refuses
# with): the peak RSS of banded noise over independent noise's, per byte of
# its state, measured 5.5-5.9 (server round) and 6.1-6.6 (`training.run`) at
# b = 20 on the published LSTM (two runs), 5.7-5.9 at b = 32 and 64 on the
# LSTM over 100 words.
# The peak RSS of `training.run` with independent noise at the published
# shape (TensorFlow, TFF's traced computations, the model, its momentum,
# the cohort's sum, evaluation): 1.80-1.89 GiB measured.
BASE_BYTES = int(1.8 * 2**30)
TABLE_MARK = '<!-- table -->'
COLUMNS = ('mechanism', 'aggregator state', 'server state', 'peak RSS',
           'start-up s', 'sum of updates s', 'server update s',
           'checkpoint s', 'records s', 'server s/round', 'written/round',
           'e2e s/round')


@dataclasses.dataclass(frozen=True)
class Shape:
  """The benchmark's shape (the published one by default)."""
  vocab_size: int = 10_000
  num_clients: int = 342_477
  # None: the smallest group (`separated_cohort`), as `scripts.train` does.
  clients_per_round: Optional[int] = None
  min_separation: int = 342
  participations: int = 6
  bands: int = 342
  e2e_clients_per_round: int = 10
  e2e_rounds: int = 2
  sentences_per_client: int = 64
  seed: int = 0

  @property
  def rounds(self) -> int:
    return self.participations * self.min_separation

  def check(self) -> None:
    for name, value in dataclasses.asdict(self).items():
      if value is None and name == 'clients_per_round':
        continue  # The smallest group.
      if not isinstance(value, int) or value < (0 if name == 'seed' else 1):
        raise ValueError(f'--{name} must be a positive integer; got {value}.')
    if self.bands > self.min_separation:
      raise ValueError(f'--bands ({self.bands}) must be at most '
                       f'--min_separation ({self.min_separation}).')


def lstm_parameters(vocab_size: int) -> int:
  """Parameters of TFF's Stack Overflow LSTM (embedding 96, LSTM 670, dense
  96, logits) over `vocab_size` words and the special tokens."""
  v, embedding, lstm, dense = vocab_size + SPECIAL_TOKENS, 96, 670, 96
  return (v * embedding + 4 * lstm * (embedding + lstm + 1) +
          (lstm * dense + dense) + (dense * v + v))


def available_memory() -> int:
  """Bytes this machine can give a process now (MemAvailable)."""
  from tff_clip.program import preflight  # pylint: disable=g-import-not-at-top
  memory = preflight.available_memory()
  if memory is None:
    raise RuntimeError('/proc/meminfo has no MemAvailable.')
  return memory


def available_mechanisms() -> tuple[str, ...]:
  """The noise mechanisms the library registers (`tff_clip.aggregation.mechanisms`)."""
  from tff_clip.aggregation import mechanisms  # pylint: disable=g-import-not-at-top
  return mechanisms.NOISE_MECHANISMS.names


def noise_vectors(mechanism: str, shape: Shape) -> int:
  """Model-sized noise vectors `mechanism` keeps in its state for the run
  of `shape` (its rounds and separation): the library's `state_vectors`."""
  return train_config(shape, mechanism,
                      separated_cohort(shape)[0]).noise.state_vectors


def state_copies_at_peak() -> int:
  """Bytes a DP round holds at peak per byte of noise state."""
  from tff_clip.program import preflight  # pylint: disable=g-import-not-at-top
  return preflight.STATE_COPIES_AT_PEAK


def memory_need(vectors: int, parameters: int) -> int:
  """Bytes a DP round needs at peak with `vectors` noise vectors."""
  return (BASE_BYTES +
          state_copies_at_peak() * vectors * parameters * FLOAT_BYTES)


def uses_bands(mechanism: str) -> bool:
  """Whether `bands` shapes `mechanism`'s noise (a name tff_clip does not
  register: no)."""
  from tff_clip.aggregation import mechanisms  # pylint: disable=g-import-not-at-top
  return (mechanism in mechanisms.NOISE_MECHANISMS and
          mechanisms.NOISE_MECHANISMS.get(mechanism).uses_bands)


def label(mechanism: str, bands: int) -> str:
  return f'{mechanism} (b = {bands})' if uses_bands(mechanism) else mechanism


def gib(value: float) -> str:
  return f'{value / 2**30:.1f} GiB'


def refusal(name: str, vectors: int, parameters: int,
            memory: int) -> Optional[str]:
  """One line refusing mechanism `name` when its need exceeds `memory`."""
  need = memory_need(vectors, parameters)
  if need <= memory:
    return None
  return (f'{name}: refused before anything is built: its state holds '
          f'{vectors} noise vectors of {parameters:,} parameters '
          f'({gib(vectors * parameters * FLOAT_BYTES)}); a DP round holds '
          f'about {state_copies_at_peak()} copies of it besides '
          f'{gib(BASE_BYTES)} for TensorFlow and the model, so it needs about '
          f'{gib(need)}, and this machine has {gib(memory)} available.')


# ----------------------------------------------------------------------------
# The population and its sampler (no TensorFlow).


@functools.lru_cache(maxsize=4)
def separated_cohort(shape: Shape) -> tuple[int, int, int]:
  """(cohort, smallest group, largest group) of the min-separation sampler
  (`tff_clip.privacy.sampling.group_sizes`: b groups of equal sizes, within
  one of each other)."""
  from tff_clip.privacy import sampling  # pylint: disable=g-import-not-at-top
  smallest, largest = sampling.group_sizes(shape.num_clients,
                                           shape.min_separation)
  asked = smallest if shape.clients_per_round is None else (
      shape.clients_per_round)
  return min(asked, smallest), smallest, largest


def task_builder(shape: Shape):
  """`training.run`'s task builder: the generated users (one test user)."""

  def build(config):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tasks import stackoverflow  # pylint: disable=g-import-not-at-top
    spec = tff.simulation.baselines.ClientSpec(
        num_epochs=config.local_epochs, batch_size=config.batch_size,
        max_elements=shape.sentences_per_client, shuffle_buffer_size=1)
    return stackoverflow.build_generated_word_prediction(
        config.num_clients, train_client_spec=spec,
        vocab_size=shape.vocab_size, seed=config.seed)

  return build


def train_config(shape: Shape, mechanism: str, clients_per_round: int,
                 **overrides):
  from tff_clip.program import config  # pylint: disable=g-import-not-at-top
  return config.TrainConfig(**{**dict(
      task='stackoverflow_next_word', data_source='synthetic',
      num_clients=shape.num_clients, clients_per_round=clients_per_round,
      sampling='min_separation', min_separation=shape.min_separation,
      noise_mechanism=mechanism,
      bands=shape.bands if uses_bands(mechanism) else 1,
      noise_multiplier=1.0, rounds=shape.rounds, server_optimizer='sgdm',
      client_learning_rate=0.5, seed=shape.seed, progress=False), **overrides})


# ----------------------------------------------------------------------------
# One mechanism, in its own process.


def _status(field: str) -> int:
  """/proc/self/status `field` (VmRSS, VmHWM) in bytes."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f'/proc/self/status has no {field}.')


def _reset_peak() -> None:
  with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # VmHWM := VmRSS (Linux >= 4.0).


def _written() -> int:
  """Bytes this process has handed to write(2) so far."""
  with open('/proc/self/io') as f:
    return next(int(line.split()[1]) for line in f
                if line.startswith('wchar:'))


def _seconds_since_start() -> float:
  """Wall seconds since this process started (/proc/self/stat)."""
  with open('/proc/self/stat') as f:
    started = int(f.read().rsplit(')', 1)[1].split()[19])
  with open('/proc/uptime') as f:
    uptime = float(f.read().split()[0])
  return uptime - started / os.sysconf('SC_CLK_TCK')


def _nbytes(value) -> int:
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return sum(np.asarray(leaf).nbytes for leaf in tf.nest.flatten(value))


def _server_round(shape, mechanism, cohort, directory):
  """Start-up and one full-cohort server round (the server half of
  `simulation.InProcessRunner.next`, timed piece by piece)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_clip.aggregation import dp
  from tff_clip.privacy import accounting, privacy_ledger, sampling
  from tff_clip.program import assembly, checkpoints, run_records
  from tff_clip.runtime import client_data, simulation, tf_graphs  # pylint: disable=g-import-not-at-top,g-multiple-import
  config = train_config(shape, mechanism, cohort)
  task = task_builder(shape)(config)
  sampler = sampling.ClientSampler(
      list(task.datasets.train_data.client_ids), cohort,
      sampling.MIN_SEPARATION, shape.seed, shape.min_separation)
  process = assembly.build_process(config, task, config.noise_multiplier)
  form = simulation.map_reduce_form(process)
  piece = {name: tf_graphs.TensorFlowFunction(getattr(form, name)) for name in
           ('prepare', 'work', 'zero', 'accumulate', 'report', 'update')}
  initialize = tf_graphs.TensorFlowFunction(
      tff.backends.mapreduce.get_state_initialization_computation(
          process.initialize))
  state_type = process.next.type_signature.parameter[0].member
  state = tf_graphs.pack_value(state_type, initialize())
  result = dict(startup_s=_seconds_since_start(),
                parameters=sum(np.asarray(w).size for w in
                               state.global_model_weights.trainable),
                model_bytes=_nbytes(state.global_model_weights),
                aggregator_bytes=_nbytes(state.aggregator),
                state_bytes=_nbytes(state))
  leaves = tf_graphs.flatten_value(state, state_type, [])
  client_input = list(piece['prepare'](*leaves))
  user = sampler.sample(1)[0]
  dataset = client_data.ClientDatasets(task, shape.seed, 1).dataset(user, 1)
  work = list(piece['work'](*tf_graphs.flatten_value(
      dataset, piece['work'].type_signature.parameter[0], []),
      *client_input))
  result_type = form.work.type_signature.result
  update = work[:tf_graphs.count_leaves(result_type[0])]
  secure = [np.zeros(t.shape, t.dtype.as_numpy_dtype) for i in (1, 2, 3)
            for t in tff.structure.flatten(result_type[i])]
  started = time.perf_counter()
  total = list(piece['zero']())
  for _ in range(cohort):
    total = list(piece['accumulate'](*total, *update))
  result['sum_s'] = time.perf_counter() - started
  report = list(piece['report'](*total))
  times = []
  del work, total
  for _ in range(3):  # Each from the state the previous one returned.
    started = time.perf_counter()
    # As `InProcessRunner.next`: the result packed as numpy at once, the old
    # state dropped then, as the training loop drops it.
    state = tf_graphs.pack_value(process.next.type_signature.result, piece[
        'update'](*leaves, *report, *secure)).state
    leaves = tf_graphs.flatten_value(state, state_type, [])
    times.append(time.perf_counter() - started)
  result['update_s'] = statistics.median(times)
  event = dp.extract_dp_event(state.aggregator)
  store = checkpoints.Checkpoints(os.path.join(directory, 'server'))
  started = time.perf_counter()
  store.save(1, [np.asarray(leaf) for leaf in leaves],
                   dict(pending=[dict(round=1, row=dict(round=1),
                                      event=None)]))
  result['checkpoint_s'] = time.perf_counter() - started
  result['checkpoint_bytes'] = os.path.getsize(
      os.path.join(directory, 'server', 'round_000001.npz'))
  ledger = privacy_ledger.PrivacyLedger()
  for round_num in range(1, shape.rounds):
    ledger.record(round_num, accounting.min_separation_round_event(
        event, round_num - 1, shape.min_separation))
  log = run_records.ReleaseLog(directory)
  started = time.perf_counter()
  ledger.record(shape.rounds, accounting.min_separation_round_event(
      event, shape.rounds - 1, shape.min_separation))
  row = dict(round=1, epsilon=ledger.guarantee(config.delta).epsilon)
  log.append(1, row, privacy_ledger.event_to_dict(event))
  run_records.append_metrics_csv(os.path.join(directory, 'metrics.csv'),
                                 [row])
  result['records_s'] = time.perf_counter() - started
  result['peak_rss_bytes'] = _status('VmHWM')
  return result


def _end_to_end(shape, mechanism, directory):
  """`training.run` at the small cohort: s/round and bytes per round, from a
  1-round and a (1 + e2e_rounds)-round run sharing one traced session."""
  from tff_clip.program import training  # pylint: disable=g-import-not-at-top
  builder = task_builder(shape)

  def run(rounds, name):
    config = train_config(shape, mechanism, shape.e2e_clients_per_round,
                          rounds=rounds, eval_every=rounds,
                          root_output_dir=directory, experiment_name=name)
    written, started = _written(), time.perf_counter()
    training.run(config, builder)
    return (time.perf_counter() - started, _written() - written,
            os.path.join(config.output_dir, 'checkpoints',
                         f'round_{rounds:06d}.npz'))

  _reset_peak()
  first, _, _ = run(1, 'first')  # Traces the session.
  short, short_bytes, _ = run(1, 'short')
  long, long_bytes, checkpoint = run(1 + shape.e2e_rounds, 'long')
  return dict(program_startup_s=first - short,
              e2e_s=(long - short) / shape.e2e_rounds,
              e2e_written_bytes=(long_bytes - short_bytes) / shape.e2e_rounds,
              e2e_checkpoint_bytes=os.path.getsize(checkpoint),
              e2e_peak_rss_bytes=_status('VmHWM'))


def measure_one(shape: Shape, mechanism: str, cohort: int) -> dict:
  with tempfile.TemporaryDirectory() as directory:
    result = _server_round(shape, mechanism, cohort, directory)
    result.update(_end_to_end(shape, mechanism, directory))
  # A DP round writes its checkpoint and its records. The end-to-end runs
  # are a few rounds long, and a mechanism optimized for the run's length
  # (BLT) keeps fewer buffers there: the checkpoint is the published run's
  # (the server round's), the records those the runs wrote besides theirs.
  result['written_bytes'] = result['checkpoint_bytes'] + (
      result['e2e_written_bytes'] - result['e2e_checkpoint_bytes'])
  return result


# ----------------------------------------------------------------------------
# The table.


def _size(value, model_bytes) -> str:
  if value >= 1e9:
    text = f'{value / 1e9:.2f} GB'
  elif value >= 1e6:
    text = f'{value / 1e6:.1f} MB'
  else:
    text = f'{value / 1e3:.1f} kB'
  return f'{text} ({value / model_bytes:.2f}x)' if model_bytes else text


def row_cells(name: str, result: Optional[dict] = None,
              note: str = '') -> list[str]:
  """The table's cells for one mechanism: measured, or `note` across."""
  if result is None:
    return [name, note] + [''] * (len(COLUMNS) - 2)
  model = result['model_bytes']
  server = (result['sum_s'] + result['update_s'] + result['checkpoint_s'] +
            result['records_s'])
  return [name, _size(result['aggregator_bytes'], model),
          _size(result['state_bytes'], model),
          f'{result["peak_rss_bytes"] / 2**30:.2f} GiB',
          f'{result["startup_s"]:.1f}', f'{result["sum_s"]:.2f}',
          f'{result["update_s"]:.3f}', f'{result["checkpoint_s"]:.3f}',
          f'{result["records_s"]:.3f}', f'{server:.2f}',
          _size(result['written_bytes'], model), f'{result["e2e_s"]:.2f}']


def refused_cells(name: str, vectors: int, parameters: int,
                  memory: int) -> list[str]:
  """A refused mechanism's row: its state and checkpoint computed (every DP
  round checkpoints the whole server state), its memory need."""
  model = parameters * FLOAT_BYTES
  server = _size((vectors + MODEL_VECTORS) * model, model) + ', computed'
  cells = row_cells(name, note='')
  cells[1] = _size(vectors * model, model) + ', computed'
  cells[2] = cells[COLUMNS.index('written/round')] = server
  cells[3] = (f'needs {gib(memory_need(vectors, parameters))}: refused '
              f'({gib(memory)} available)')
  return cells


def format_table(rows) -> str:
  lines = ['| ' + ' | '.join(COLUMNS) + ' |',
           '|' + '---|' * len(COLUMNS)]
  lines += ['| ' + ' | '.join(cells) + ' |' for cells in rows]
  return '\n'.join(lines)


def _measure_in_child(shape, mechanism, cohort) -> dict:
  """`measure_one` in a fresh interpreter (its own peak RSS)."""
  with tempfile.TemporaryDirectory() as directory:
    result_path = os.path.join(directory, 'result.json')
    stderr_path = os.path.join(directory, 'stderr')
    flags_ = [f'--{k}={v}' for k, v in dataclasses.asdict(shape).items()
              if k not in ('seed', 'clients_per_round')]
    command = [sys.executable, '-m', 'scripts.benchmark_stackoverflow',
               *flags_, f'--measure_one={mechanism}', f'--result={result_path}',
               f'--clients_per_round={cohort}']
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(stderr_path, 'w') as stderr:
      code = cli.run_child(command, cwd=repo, stdout=subprocess.DEVNULL,
                           stderr=stderr)
    if code != 0:
      with open(stderr_path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
      return dict(error=lines[-1] if lines else f'exit code {code}')
    with open(result_path) as f:
      return json.load(f)


def plan(shape: Shape, mechanisms, bands, memory: int):
  """[(mechanism, its shape, its noise vectors, refusal line or None, note
  or None)], one per row (banded: one per number of bands), before anything
  is built."""
  available = available_mechanisms()
  parameters = lstm_parameters(shape.vocab_size)
  planned = []
  for mechanism in mechanisms:
    for b in bands if uses_bands(mechanism) else [shape.bands]:
      shaped = dataclasses.replace(shape, bands=b)
      if mechanism not in available:
        planned.append((mechanism, shaped, None, None, 'not yet available '
                        f"(tff_clip has no '{mechanism}' noise mechanism)"))
        continue
      vectors = noise_vectors(mechanism, shaped)
      planned.append((mechanism, shaped, vectors, refusal(
          label(mechanism, b), vectors, parameters, memory), None))
  return planned


def write_doc(path: str, table: str, header: str) -> None:
  with open(path) as f:
    text = f.read()
  parts = text.split(TABLE_MARK)
  if len(parts) != 3:
    raise ValueError(f'--doc: {path} needs two {TABLE_MARK} lines around '
                     'the table.')
  with open(path, 'w') as f:
    f.write(f'{parts[0]}{TABLE_MARK}\n{header}\n\n{table}\n{TABLE_MARK}'
            f'{parts[2]}')


def _bands() -> list[int]:
  try:
    return [int(b) for b in _BANDS.value]
  except ValueError:
    raise ValueError('--bands must be positive integers; got '
                     f'{",".join(_BANDS.value)}.') from None


def _shape_from_flags(bands: int) -> Shape:
  return Shape(vocab_size=_VOCAB.value, num_clients=_USERS.value,
               clients_per_round=_COHORT.value,
               min_separation=_SEPARATION.value,
               participations=_PARTICIPATIONS.value, bands=bands,
               e2e_clients_per_round=_E2E_COHORT.value,
               e2e_rounds=_E2E_ROUNDS.value,
               sentences_per_client=_SENTENCES.value)


def main(argv):
  del argv
  bands = _bands()
  for b in bands:
    _shape_from_flags(b).check()
  shape = _shape_from_flags(bands[0])
  unknown = set(_MECHANISMS.value) - set(NOISE_MECHANISMS)
  if unknown:
    raise ValueError(f'--mechanisms: {", ".join(sorted(unknown))} unknown; '
                     f'choose from {", ".join(NOISE_MECHANISMS)}.')
  if _ONE.value:
    with open(_RESULT.value, 'w') as f:
      json.dump(measure_one(shape, _ONE.value, separated_cohort(shape)[0]),
                f)
    return 0
  memory = (available_memory() if _MEMORY.value is None else
            int(_MEMORY.value * 2**30))
  parameters = lstm_parameters(shape.vocab_size)
  cohort, smallest, largest = separated_cohort(shape)
  asked = ('the smallest group' if shape.clients_per_round is None else
           f'asked {shape.clients_per_round:,}')
  print(f'{shape.num_clients:,} users in {shape.min_separation} groups of '
        f'{smallest:,} to {largest:,}: {cohort:,} users a round '
        f'({asked}); the LSTM has {parameters:,} '
        f'parameters ({parameters * FLOAT_BYTES / 1e6:.1f} MB); '
        f'{gib(memory)} of memory available.', flush=True)
  rows = []
  for mechanism, shaped, vectors, line, note in plan(
      shape, _MECHANISMS.value, bands, memory):
    name = label(mechanism, shaped.bands)
    if note:
      rows.append(row_cells(name, note=note))
    elif line:
      print(line, flush=True)
      rows.append(refused_cells(name, vectors, parameters, memory))
    else:
      result = _measure_in_child(shaped, mechanism, cohort)
      if 'error' in result:
        print(f'{name}: failed: {result["error"]}', flush=True)
        rows.append(row_cells(name, note=f'failed: {result["error"]}'))
      else:
        rows.append(row_cells(name, result))
        print(f'{name}: checkpoint {result["checkpoint_bytes"] / 1e6:.1f} MB;'
              f' training.run: start-up {result["program_startup_s"]:.1f} s '
              f'(its session: task, tracing, evaluation), peak RSS '
              f'{result["e2e_peak_rss_bytes"] / 2**30:.2f} GiB, '
              f'{result["e2e_written_bytes"] / 1e6:.1f} MB written per round '
              f'(checkpoint {result["e2e_checkpoint_bytes"] / 1e6:.1f} MB)',
              flush=True)
    print('| ' + ' | '.join(rows[-1]) + ' |', flush=True)
  table = format_table(rows)
  print()
  print(table)
  if _DOC.value:
    command = ' '.join(['.venv/bin/python -m scripts.benchmark_stackoverflow']
                       + sys.argv[1:])
    header = (f'`{command}` on {os.cpu_count()} CPU cores '
              f'({platform.machine()}), '
              f'{gib(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))}'
              f' of memory, {datetime.date.today().isoformat()}: '
              f'{shape.num_clients:,} users, {cohort:,} a round (the smallest '
              f'of {shape.min_separation} groups: {smallest:,} to '
              f'{largest:,}), {parameters:,} parameters.')
    write_doc(_DOC.value, table, header)
  return 0


if __name__ == '__main__':
  cli.run(main)
