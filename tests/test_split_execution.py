"""Specification of the split runner (`tff_clip.split_execution`).

The server's half of a round (prepare, update, initialize) runs in this
process; TFF's C++ worker sees only the client half. Oracles: TFF's own
`process.next` on the same C++ runtime (same round, fixed noise seed), and
the bytes of every request the gRPC stub sends to the worker, searched for
the aggregator's secret noise key.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip import algorithms
from tff_clip import dp
from tff_clip import execution
from tff_clip import split_execution
import tiny_model  # pylint: disable=g-bad-import-order

_STUB_METHODS = ('create_value', 'create_call', 'create_struct',
                 'create_selection', 'get_executor')


def client_datasets(round_num, sizes=(5, 3, 7)):
  datasets = []
  for client, size in enumerate(sizes):
    rng = np.random.default_rng([round_num, client])
    x = rng.normal(size=[size, 3]).astype(np.float32)
    y = (x @ rng.normal(scale=2.0, size=[3, 2])).astype(np.float32)
    datasets.append(tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).batch(2))
  return datasets


def dp_process(noise_seed=None):
  sgd = tff.learning.optimizers.build_sgdm
  return algorithms.build_fedavg(
      tiny_model.model_fn, client_optimizer=sgd(0.1),
      server_optimizer=sgd(1.0),
      model_aggregator=dp.dp_factory('clip', noise_multiplier=0.5,
                                     clients_per_round=3.0, clip_norm=1.0,
                                     noise_seed=noise_seed))


def noise_key(state) -> np.ndarray:
  """The `noise_key` leaf of the state's aggregator (the DP query's state)."""
  found = []

  def visit(value):
    if hasattr(value, '_asdict'):
      for name, element in value._asdict().items():
        if name == 'noise_key':
          found.append(np.asarray(element))
        else:
          visit(element)
    elif isinstance(value, collections.abc.Mapping):
      for element in value.values():
        visit(element)
    elif isinstance(value, (list, tuple)):
      for element in value:
        visit(element)

  visit(state.aggregator)
  assert len(found) == 1, found
  return found[0]


def key_encodings(key: np.ndarray) -> list[bytes]:
  """Bytes under which a TensorProto or Array proto may carry the key."""
  encodings = [key.astype('<i8').tobytes()]
  encodings += [np.int64(k).astype('<i8').tobytes() for k in key]
  for k in key:  # Protobuf varint of each int64 (two's complement, 64 bits).
    value, varint = int(k) & (2**64 - 1), bytearray()
    while True:
      byte, value = value & 0x7F, value >> 7
      varint.append(byte | (0x80 if value else 0))
      if not value:
        break
    encodings.append(bytes(varint))
  return encodings


@pytest.fixture
def sent_requests(monkeypatch):
  """Every request any `RemoteExecutorGrpcStub` sends, serialized."""
  sent = []
  stub_class = tff.framework.RemoteExecutorGrpcStub
  for name in _STUB_METHODS:
    original = getattr(stub_class, name)

    def recording(self, request, _original=original):
      sent.append(request.SerializeToString())
      return _original(self, request)

    monkeypatch.setattr(stub_class, name, recording)
  return sent


def sent_key(sent, key) -> bool:
  return any(e in request for request in sent for e in key_encodings(key))


@pytest.fixture(scope='module')
def seeded_process():
  return dp_process(noise_seed=11)


@pytest.fixture(scope='module')
def secret_process():
  return dp_process()


@pytest.fixture(scope='module')
def secret_runner(secret_process):
  return split_execution.SplitRunner(secret_process)


def test_split_round_equals_process_next_on_the_cpp_runtime(seeded_process):
  runner = split_execution.SplitRunner(seeded_process)
  state_cpp, state_split = seeded_process.initialize(), runner.initialize()
  for round_num in (1, 2):
    data = client_datasets(round_num)
    out_cpp = seeded_process.next(state_cpp, data)
    out_split = runner.next(state_split, data)
    leaves_split, leaves_cpp = (tf.nest.flatten(out_split),
                                tf.nest.flatten(out_cpp))
    assert len(leaves_split) == len(leaves_cpp)
    for a, e in zip(leaves_split, leaves_cpp):
      a, e = np.asarray(a), np.asarray(e)
      if e.dtype.kind == 'f':  # The runtimes add clients in other orders.
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
      else:
        np.testing.assert_array_equal(a, e)
    state_cpp, state_split = out_cpp.state, out_split.state
  assert noise_key(state_split).any()  # The key was in the state compared.


def test_workers_receive_no_server_state_type(secret_runner):
  sent_type = secret_runner._clients_round.type_signature.parameter  # pylint: disable=protected-access
  state_type = secret_process_state_type(secret_runner)
  assert split_execution.secret_paths(state_type)  # The state has a key...
  assert not split_execution.secret_paths(sent_type)  # ...what is sent none.
  assert not any(state_type.is_assignable_from(t.member) for t in sent_type)


def secret_process_state_type(runner):
  return runner._state_type  # pylint: disable=protected-access


def test_no_request_to_the_worker_holds_the_key(secret_runner, sent_requests):
  state = secret_runner.initialize()
  key = noise_key(state)
  assert key.any()
  output = secret_runner.next(state, client_datasets(1))
  assert len(sent_requests) > 3  # The worker did the clients' work.
  assert not sent_key(sent_requests, key)
  np.testing.assert_array_equal(noise_key(output.state), key)


def test_process_next_on_the_worker_sends_the_key(secret_process,
                                                   sent_requests):
  # The same oracle on TFF's own path, which sends the whole state: the
  # search above can find the key when it is there.
  state = secret_process.initialize()
  sent_requests.clear()
  secret_process.next(state, client_datasets(1))
  assert sent_key(sent_requests, noise_key(state))


def test_a_client_input_holding_the_key_is_refused(secret_runner):
  state = secret_runner.initialize()
  state_leaves = split_execution.tf_graphs.flatten_value(
      state, secret_process_state_type(secret_runner), [])
  key = noise_key(state)
  with pytest.raises(split_execution.SecretLeakError, match='noise key'):
    secret_runner._check_no_secret(  # pylint: disable=protected-access
        state_leaves, [np.zeros([3], np.float32), np.array([7, *key, 9])])


def test_a_dead_worker_stops_the_call_naming_it():
  proc, port = execution.start_worker()
  target = f'127.0.0.1:{port}'
  release = __import__('threading').Event()
  proc.kill()
  proc.wait()
  with pytest.raises(split_execution.WorkerLostError, match=target):
    split_execution.call_watching_workers(
        lambda: release.wait(60), lambda: [target], timeout_s=0.5)
  release.set()
