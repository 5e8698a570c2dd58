"""The TFF/TF internals `tff_clip.runtime.tf_graphs` relies on (its assumptions 1-6).

Each test breaks loudly when an upgrade of TFF or TensorFlow changes one of
them. Oracles: closed forms of tiny computations.
"""

import collections
import collections.abc

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clip.runtime import tf_graphs
from tff_clip.runtime import value_builders

SEQUENCE_TYPE = tff.SequenceType(np.float32)


@tff.tensorflow.computation(
    collections.OrderedDict(scale=np.float32, data=SEQUENCE_TYPE))
def _scaled_sum(arg):
  return arg['scale'] * arg['data'].reduce(np.float32(0.0), lambda s, x: s + x)


def test_serialized_tensorflow_computation_has_the_fields_read():
  # Assumption 1: the layout of TFF's `computation.proto` TensorFlow message.
  proto = tff.framework.serialize_computation(_scaled_sum)
  assert proto.WhichOneof('computation') == 'tensorflow'
  graph_def = tf.compat.v1.GraphDef()
  assert proto.tensorflow.graph_def.Unpack(graph_def)
  names = tf_graphs._binding_names(proto.tensorflow.parameter, [])  # pylint: disable=protected-access
  assert len(names) == 2
  assert proto.tensorflow.parameter.struct.element[1].sequence.HasField(
      'variant_tensor_name')
  assert proto.tensorflow.result.tensor.tensor_name
  for field in ('initialize_op', 'session_token_tensor_name'):
    assert field in type(proto.tensorflow).DESCRIPTOR.fields_by_name


def test_leaves_follow_the_type_order():
  # Assumption 2: flat leaves in the order of the type's elements.
  @tff.tensorflow.computation(collections.OrderedDict(
      a=np.float32, b=collections.OrderedDict(c=np.int32, d=np.float32)))
  def shuffle(arg):
    return collections.OrderedDict(d=arg['b']['d'], a=arg['a'],
                                   c=arg['b']['c'])

  function = tf_graphs.TensorFlowFunction(shuffle)
  value = collections.OrderedDict(a=1.0, b=collections.OrderedDict(c=2, d=3.0))
  leaves = tf_graphs.flatten_value(value, shuffle.type_signature.parameter, [])
  assert [float(x) for x in leaves] == [1.0, 2.0, 3.0]
  result = tf_graphs.pack_value(shuffle.type_signature.result,
                                function(*leaves))
  assert result == collections.OrderedDict(d=3.0, a=1.0, c=2)


def test_dataset_reduction_becomes_a_sequential_loop():
  # Assumption 4: a top-level ReduceDataset, rewritten into a While loop
  # with the same result: 2 * (1 + 2 + 3 + 4).
  proto = tff.framework.serialize_computation(_scaled_sum)
  graph_def = tf.compat.v1.GraphDef()
  proto.tensorflow.graph_def.Unpack(graph_def)
  assert 'ReduceDataset' in {node.op for node in graph_def.node}
  function = tf_graphs.TensorFlowFunction(_scaled_sum)
  run, _ = function._functions()  # pylint: disable=protected-access
  op_types = {op.type for op in run.graph.get_operations()}
  assert 'ReduceDataset' not in op_types
  assert 'While' in op_types
  data = tf.data.Dataset.from_tensor_slices(np.arange(1, 5, dtype=np.float32))
  leaves = tf_graphs.flatten_value(
      collections.OrderedDict(scale=2.0, data=data),
      _scaled_sum.type_signature.parameter, [])
  assert float(function(*leaves)[0]) == 20.0
  empty = tf_graphs.flatten_value(
      collections.OrderedDict(scale=2.0, data=data.take(0)),
      _scaled_sum.type_signature.parameter, [])
  assert float(function(*empty)[0]) == 0.0


def test_variables_are_reset_before_every_call():
  # Assumption 3: variables persist between calls; the computation's
  # initializer, run before each call, resets them (as Keras metrics need).
  @tff.tensorflow.computation(np.float32)
  def accumulate_once(x):
    total = tf.Variable(0.0)
    with tf.control_dependencies([total.assign_add(x)]):
      return total.read_value()

  function = tf_graphs.TensorFlowFunction(accumulate_once)
  assert [float(function(np.float32(3.0))[0]) for _ in range(3)] == [3.0] * 3


def test_random_ops_draw_afresh_on_every_call():
  # Client-placed DP noise lives in `work`, called once per client: each
  # call must draw new values, not replay the first call's.
  @tff.tensorflow.computation
  def draw():
    return tf.random.normal([4])

  function = tf_graphs.TensorFlowFunction(draw)
  first, second = function()[0].numpy(), function()[0].numpy()
  assert not np.allclose(first, second)


def test_a_while_loop_of_a_map_reduce_form_imports():
  # TFF's MapReduceForm lowers a while loop to TF1 control flow, a cycle
  # (Merge -> Switch -> ... -> NextIteration -> Merge). The import walks each
  # node once; one that expanded a node again when reached around the cycle
  # grew its stack without end (MemoryError). The audit's `update` (2K
  # canaries drawn and compared in loops) has such loops.
  @tff.tensorflow.computation(np.int32, np.int32)
  def triangular(n, total):
    _, total = tf.while_loop(lambda i, _: i <= n,
                             lambda i, total: (i + 1, total + i),
                             (tf.constant(1), total))
    return total

  @tff.tensorflow.computation(np.int32)
  def identity(x):
    return x

  @tff.federated_computation(tff.FederatedType(np.int32, tff.SERVER),
                             tff.FederatedType(np.int32, tff.CLIENTS))
  def next_fn(n, client_values):
    total = tff.federated_sum(tff.federated_map(identity, client_values))
    return (tff.federated_map(triangular, tff.federated_zip((n, total))),
            tff.federated_value((), tff.SERVER))

  update = tff.backends.mapreduce.get_map_reduce_form_for_computation(
      next_fn).update
  graph_def = tf.compat.v1.GraphDef()
  tff.framework.serialize_computation(update).tensorflow.graph_def.Unpack(
      graph_def)
  assert 'NextIteration' in {node.op for node in graph_def.node}
  state = tf_graphs.TensorFlowFunction(update)(np.int32(10), np.int32(0))
  assert [int(x) for x in state] == [55]  # n (n + 1) / 2; no output leaves.


def test_the_same_computation_imports_twice_under_distinct_names():
  # Assumption 5: imported functions are renamed per import, so two imports
  # of graphs defining the same function names coexist in one process.
  first = tf_graphs.TensorFlowFunction(_scaled_sum)
  second = tf_graphs.TensorFlowFunction(_scaled_sum)
  data = tf.data.Dataset.from_tensor_slices(np.ones(3, np.float32))
  leaves = tf_graphs.flatten_value(
      collections.OrderedDict(scale=1.0, data=data),
      _scaled_sum.type_signature.parameter, [])
  assert float(first(*leaves)[0]) == float(second(*leaves)[0]) == 3.0


def test_concrete_functions_are_called_on_flat_tensors():
  # Assumption 6: the private flat call used to skip signature binding.
  function = tf.function(lambda x: 2.0 * x).get_concrete_function(
      tf.TensorSpec([], tf.float32))
  assert float(tf_graphs.call_flat(function, [tf.constant(1.5)])) == 3.0


def test_non_tensorflow_computation_is_refused_with_its_type():
  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def total(values):
    return tff.federated_sum(values)

  with pytest.raises(ValueError, match='Only TensorFlow computations'):
    tf_graphs.TensorFlowFunction(total)


# ----------------------------------------------------------------------------
# The canonical digest (`graph_defs.canonical_digest`): the same for every
# trace of one computation, another for another constant.


def _scaled_sum_of(scale):
  @tf.function
  def inner(x):
    return x * scale

  @tff.tensorflow.computation(tff.TensorType(np.float32, [3]))
  def computation(x):
    return tf.reduce_sum(inner(x))

  return computation


def test_two_traces_of_one_computation_have_one_digest_not_one_byte_string():
  from tff_clip.runtime import graph_defs
  first, second = _scaled_sum_of(2.0), _scaled_sum_of(2.0)
  serialized = [tff.framework.serialize_computation(c).SerializeToString()
                for c in (first, second)]
  assert serialized[0] != serialized[1]  # Function names from a counter.
  assert (graph_defs.canonical_digest(first) ==
          graph_defs.canonical_digest(second))


def test_a_constant_of_the_graph_changes_the_digest():
  from tff_clip.runtime import graph_defs
  assert (graph_defs.canonical_digest(_scaled_sum_of(2.0)) !=
          graph_defs.canonical_digest(_scaled_sum_of(3.0)))


def _containers(value):
  """Every container of `value` with its type and keys, depth first."""
  if isinstance(value, collections.abc.Mapping):
    return [(type(value), list(value))] + [
        c for v in value.values() for c in _containers(v)]
  if isinstance(value, (list, tuple)):
    return [(type(value), len(value))] + [
        c for v in value for c in _containers(v)]
  if hasattr(type(value), '__attrs_attrs__'):
    fields = [f.name for f in type(value).__attrs_attrs__]
    return [(type(value), fields)] + [
        c for f in fields for c in _containers(getattr(value, f))]
  return []


def test_packed_values_are_tffs_own_containers():
  # The packer of a learning process's types (attrs, named tuples, ordered
  # and plain dicts, lists, empty structures) gives what TFF's
  # `type_to_py_container` gives: the same containers, keys and leaves.
  from tff_clip.aggregation import dp
  from tff_clip.learning import algorithms
  import tiny_model  # pylint: disable=g-import-not-at-top
  process = algorithms.build_fedavg(
      tiny_model.model_fn,
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9),
      model_aggregator=dp.dp_factory('clip', noise_multiplier=0.5,
                                     clients_per_round=3.0,
                                     clip_norm='adaptive'))
  for type_spec in (process.initialize.type_signature.result,
                    process.next.type_signature.result):
    count = tf_graphs.count_leaves(type_spec)
    leaves = [np.full([2], i, np.float32) for i in range(count)]
    packed = tf_graphs.pack_value(type_spec, leaves)
    expected = tff.types.type_to_py_container(
        tf_graphs._pack(type_spec, iter(leaves)), type_spec)  # pylint: disable=protected-access
    assert _containers(packed) == _containers(expected)
    for a, b in zip(tf.nest.flatten(packed), tf.nest.flatten(expected),
                    strict=True):
      np.testing.assert_array_equal(a, b)


class _Leaf:

  def __init__(self, index):
    self.index = index


_Pair = collections.namedtuple('_Pair', ['b', 'a'])


def test_a_built_value_is_what_tf_nest_packs():
  # Containers of every kind the builder makes (dict keys out of sorted
  # order, whose leaves tf.nest takes sorted), against tf.nest itself.
  import attr  # pylint: disable=g-import-not-at-top

  @attr.s(frozen=True)
  class Attrs:
    z = attr.ib()
    y = attr.ib()

  shape = lambda leaf: collections.OrderedDict(
      b=[leaf(), (leaf(), _Pair(leaf(), {'y': leaf(), 'x': leaf()}))],
      a=Attrs(leaf(), collections.OrderedDict()), c=(), d=[leaf()])
  count = len(tf.nest.flatten(shape(object)))
  positions = iter(np.random.default_rng(0).permutation(count))
  template = shape(lambda: _Leaf(int(next(positions))))
  build = value_builders.builder(template, _Leaf)
  leaves = [f'leaf {i}' for i in range(count)]
  expected = tf.nest.pack_sequence_as(
      template, [leaves[p.index] for p in tf.nest.flatten(template)])
  built = build(leaves)
  assert repr(built) == repr(expected)
  tf.nest.assert_same_structure(built, expected, check_types=True)
  assert build([f'other {i}' for i in range(count)]) != built


def test_a_container_the_builder_does_not_make_is_packed_by_tf_nest():
  class Mapping(collections.abc.Mapping):  # tf.nest's, not the builder's.

    def __init__(self, *args, **kwargs):
      self._items = dict(*args, **kwargs)

    def __getitem__(self, key):
      return self._items[key]

    def __iter__(self):
      return iter(self._items)

    def __len__(self):
      return len(self._items)

  template = [Mapping(a=_Leaf(1), b=_Leaf(0))]
  built = value_builders.builder(template, _Leaf)(['zero', 'one'])
  assert type(built[0]) is Mapping and dict(built[0]) == {'a': 'one',
                                                          'b': 'zero'}


def test_a_function_imports_its_graph_on_its_first_call_only():
  """A runner's functions are imported when first called (a batched round
  calls neither the per-client work nor the accumulation), once, and
  answer as an eager import would."""
  function = tf_graphs.TensorFlowFunction(_scaled_sum)
  assert function._functions_built is None  # pylint: disable=protected-access
  data = tf.data.Dataset.from_tensor_slices(np.arange(1, 5, dtype=np.float32))
  leaves = tf_graphs.flatten_value(
      collections.OrderedDict(scale=3.0, data=data),
      _scaled_sum.type_signature.parameter, [])
  assert float(function(*leaves)[0]) == 30.0
  built = function._functions()  # pylint: disable=protected-access
  assert float(function(*leaves)[0]) == 30.0
  assert function._functions() is built  # pylint: disable=protected-access
