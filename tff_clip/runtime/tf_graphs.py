"""TFF's TensorFlow computations as plain TensorFlow functions, in this process.

A `tff.tensorflow.computation` is stored as a serialized `GraphDef` plus
bindings that name its parameter and result tensors (TFF's `computation.proto`,
message `TensorFlow`). `TensorFlowFunction` imports that graph into a
`tf.compat.v1.wrap_function` and calls it like any concrete function: no TFF
executor, no gRPC, default device placement (a visible GPU is used).

Every assumption this module makes about TFF's and TensorFlow's internals is
listed here and checked by `tests/test_tf_graphs.py`, so an upgrade that
breaks one fails loudly there rather than silently here:

  1. `tff.framework.serialize_computation(comp)` of a TF computation holds a
     `tensorflow` oneof with `graph_def` (an `Any` packing a `GraphDef`),
     `parameter`/`result` bindings (`tensor.tensor_name`,
     `sequence.variant_tensor_name`, `struct.element`), `initialize_op` and
     `session_token_tensor_name`.
  2. Bindings flatten depth-first in the order of the TFF type's elements.
  3. The graph's variables persist across calls (resource handles with shared
     names), and `initialize_op` resets them: it runs before every call, as
     TFF's own runtime does (Keras metric variables would otherwise
     accumulate across clients).
  4. A dataset loop (`for batch in dataset` inside `tf.function`) is a
     top-level `ReduceDataset` op (attrs `f`, `Tstate`, `Targuments`,
     `output_shapes`; inputs: dataset, initial state, other arguments). TF
     re-instantiates its function on every call, ~50 ms per client; it is
     rewritten into an iterator and a `tf.while_loop` calling the same `f`,
     about 1 ms. `parallel_iterations=1`: `f` updates variables in place.
  6. `ConcreteFunction._call_flat(tensors, captured_inputs)` calls a pruned
     function on flat tensors (see `call_flat`).
  5. Two graphs can define functions with the same name but different bodies;
     TF refuses that in one process, so every imported function is renamed
     with a per-import suffix (and so are the variables' shared names).
"""

from __future__ import annotations

import collections
import collections.abc
import functools
import importlib
import itertools
import sys
import threading
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2 as pb
from tensorflow_federated.python.core.impl.types import type_serialization

from tff_clip.runtime import graph_defs
from tff_clip.runtime import value_builders

__all__ = ['TensorFlowFunction', 'call_flat', 'flatten_value', 'pack_value',
           'count_leaves', 'tiny_dataset_options']

_counter = itertools.count()
_IMPORTING = threading.Lock()  # One function's import at a time, any thread.
_REDUCE_OPS = ('ReduceDataset',)


def tiny_dataset_options() -> tf.data.Options:
  """tf.data options for the many small client datasets of a simulation.

  The default static optimisations and autotuning are set up anew for each
  iterator: for a client with a few batches that costs more than the data.
  """
  options = tf.data.Options()
  options.experimental_optimization.apply_default_optimizations = False
  options.autotune.enabled = False
  options.experimental_deterministic = True
  return options


# ----------------------------------------------------------------------------
# Values <-> flat leaves, following a TFF type depth-first (assumption 2).


def _element(value, index, name):
  """Element `index` (named `name`) of a TFF struct, mapping, attrs or tuple."""
  if isinstance(value, tff.structure.Struct):
    return value[index]
  if isinstance(value, collections.abc.Mapping):
    return value[name] if name in value else list(value.values())[index]
  if isinstance(value, (list, tuple)) and not hasattr(type(value), '_fields'):
    return value[index]
  if name is not None and hasattr(value, name):  # attrs, namedtuple.
    return getattr(value, name)
  if isinstance(value, (list, tuple)):
    return value[index]
  raise TypeError(f'Cannot take element {index} ({name!r}) of {value!r}.')


def flatten_value(value, type_spec, out: list) -> list:
  """Appends the leaves of `value` (structured as `type_spec`) to `out`."""
  if isinstance(type_spec, tff.FederatedType):
    return flatten_value(value, type_spec.member, out)
  if isinstance(type_spec, tff.TensorType):
    out.append(value)
  elif isinstance(type_spec, tff.SequenceType):
    if not isinstance(value, tf.data.Dataset):
      raise TypeError(f'Expected a tf.data.Dataset for {type_spec}; got '
                      f'{type(value).__name__}.')
    out.append(tf.data.experimental.to_variant(
        value.with_options(tiny_dataset_options())))
  elif isinstance(type_spec, tff.StructType):
    for index, (name, element_type) in enumerate(tff.structure.to_elements(type_spec)):
      flatten_value(_element(value, index, name), element_type, out)
  else:
    raise TypeError(f'Unsupported type {type_spec}.')
  return out


def count_leaves(type_spec) -> int:
  if isinstance(type_spec, tff.FederatedType):
    return count_leaves(type_spec.member)
  if isinstance(type_spec, tff.StructType):
    return sum(count_leaves(t) for _, t in tff.structure.to_elements(type_spec))
  return 1


def _pack(type_spec, leaves):
  if isinstance(type_spec, tff.FederatedType):
    return _pack(type_spec.member, leaves)
  if isinstance(type_spec, tff.StructType):
    return tff.structure.Struct(
        [(name, _pack(t, leaves)) for name, t in tff.structure.to_elements(type_spec)])
  return next(leaves)


def _slow_pack(type_spec, leaves):
  return tff.types.type_to_py_container(_pack(type_spec, iter(leaves)),
                                        type_spec)


@functools.lru_cache(maxsize=64)
def _packer(type_spec):
  """`leaves -> value` as `_slow_pack` for `type_spec`, without TFF's per-call
  type walk: `_slow_pack` of the leaves' positions is a template whose
  `tf.nest` order of positions says where each leaf goes (None: a container
  `tf.nest` does not know, e.g. a `Struct`; packed by TFF then)."""
  count = count_leaves(type_spec)
  template = _slow_pack(type_spec, [_Position(i) for i in range(count)])
  order = tf.nest.flatten(template)
  if sorted(p.index for p in order if isinstance(p, _Position)) != list(
      range(count)) or len(order) != count:
    return None
  return value_builders.builder(template, _Position)


class _Position:
  """A leaf's place in the flat leaves (a `_packer` template's leaf)."""
  __slots__ = ('index',)

  def __init__(self, index):
    self.index = index


def pack_value(type_spec, leaves: Sequence[Any]):
  """The value TFF would return for `type_spec`, from its flat leaves."""
  def as_numpy(leaf):
    return leaf.numpy() if hasattr(leaf, 'numpy') else np.asarray(leaf)
  leaves = [as_numpy(x) for x in leaves]
  try:
    packer = _packer(type_spec)
  except TypeError:  # An unhashable type: TFF's walk.
    packer = None
  return _slow_pack(type_spec, leaves) if packer is None else packer(leaves)


# ----------------------------------------------------------------------------
# The Python containers of a TFF type (`LearningProcessOutput`, `ModelWeights`,
# ...) are not part of its serialized form (`pb.Type`): they travel beside it
# as a tree of class names, resolved only among modules already imported.


def container_tree(type_spec):
  """The Python containers of `type_spec`'s structs, as plain data (JSON)."""
  if isinstance(type_spec, tff.FederatedType):
    return container_tree(type_spec.member)
  if isinstance(type_spec, tff.FunctionType):
    return {'parameter': (None if type_spec.parameter is None
                          else container_tree(type_spec.parameter)),
            'result': container_tree(type_spec.result)}
  if isinstance(type_spec, tff.SequenceType):
    return {'sequence': container_tree(type_spec.element)}
  if isinstance(type_spec, tff.StructType):
    container = getattr(type_spec, 'python_container', None)
    return {'container': None if container is None else _class_path(container),
            'fields': list(getattr(container, '_fields', ())),
            'elements': [container_tree(t) for _, t in
                         tff.structure.to_elements(type_spec)]}
  return None


def with_containers(type_spec, tree):
  """`type_spec` with the containers of `container_tree` put back."""
  if tree is None:
    return type_spec
  if isinstance(type_spec, tff.FederatedType):
    return tff.FederatedType(with_containers(type_spec.member, tree),
                             type_spec.placement, type_spec.all_equal)
  if isinstance(type_spec, tff.FunctionType):
    return tff.FunctionType(
        None if type_spec.parameter is None else
        with_containers(type_spec.parameter, tree['parameter']),
        with_containers(type_spec.result, tree['result']))
  if isinstance(type_spec, tff.SequenceType):
    return tff.SequenceType(with_containers(type_spec.element,
                                            tree['sequence']))
  if isinstance(type_spec, tff.StructType):
    elements = [(name, with_containers(t, subtree)) for (name, t), subtree in
                zip(tff.structure.to_elements(type_spec), tree['elements'],
                    strict=True)]
    if tree['container'] is None:
      return tff.StructType(elements)
    return tff.StructWithPythonType(
        elements, _container_class(tree['container'], tuple(tree['fields'])))
  raise ValueError(f'A container tree for the non-struct type {type_spec}.')


# The packages whose modules a container's name may import.
_CONTAINER_PACKAGES = ('tff_clip', 'tensorflow_federated', 'tensorflow_privacy',
                       'dp_accounting', 'collections')


def _class_path(cls: type) -> str:
  """'module:Name' or 'module:Outer.Name' reaching `cls` (a namedtuple
  made inside a class has only its own name as `__qualname__`)."""
  module = sys.modules.get(cls.__module__)
  if getattr(module, cls.__qualname__, None) is not cls:
    for outer_name, outer in sorted(vars(module or object).items()):
      if isinstance(outer, type) and vars(outer).get(cls.__name__) is cls:
        return f'{cls.__module__}:{outer_name}.{cls.__name__}'
  return f'{cls.__module__}:{cls.__qualname__}'


def _container_class(name: str, fields: tuple[str, ...]) -> type:
  """The class `name` names among the modules imported; a namedtuple that
  none holds (dp_accounting makes one per call to `to_named_tuple`) is made
  again with its name and fields."""
  module_name, _, qualname = name.partition(':')
  found = sys.modules.get(module_name)
  if found is None and module_name.split('.')[0] in _CONTAINER_PACKAGES:
    try:  # A fresh process that traced nothing has not imported it yet.
      found = importlib.import_module(module_name)
    except ImportError:
      pass
  for part in qualname.split('.'):
    found = getattr(found, part, None)
  if isinstance(found, type):
    return found
  if fields:
    return _namedtuple(module_name, qualname.split('.')[-1], fields)
  raise ValueError(f'No imported class {name}.')


@functools.lru_cache(maxsize=None)
def _namedtuple(module_name: str, name: str, fields: tuple[str, ...]) -> type:
  return collections.namedtuple(name, fields, module=module_name)


# ----------------------------------------------------------------------------
# Graph surgery.


def _binding_names(binding, out: list) -> list:
  kind = binding.WhichOneof('binding')
  if kind == 'tensor':
    out.append(binding.tensor.tensor_name)
  elif kind == 'sequence':
    if binding.sequence.WhichOneof('binding') != 'variant_tensor_name':
      raise ValueError('Only variant-tensor sequence bindings are supported; '
                       f'got {binding.sequence}.')
    out.append(binding.sequence.variant_tensor_name)
  elif kind == 'struct':
    for element in binding.struct.element:
      _binding_names(element, out)
  elif kind is not None:
    raise ValueError(f'Unsupported binding {kind}.')
  return out


def _rename_functions(graph_def, suffix):
  """Assumption 5: unique function names (and shared names) per import."""
  graph_defs.apply_renames(graph_def, {
      f.signature.name: f'{f.signature.name}_{suffix}'
      for f in graph_def.library.function})
  empty = 0
  for node in graph_def.node:
    shared_name = node.attr.get('shared_name')
    if shared_name is not None:
      if not shared_name.s:
        shared_name.s = f'empty_{empty}'.encode()
        empty += 1
      shared_name.s += f'_{suffix}'.encode()
  return graph_def


def _canonical(tensor_name: str) -> str:
  return tensor_name if ':' in tensor_name else f'{tensor_name}:0'


def _node_name(input_name: str) -> str:
  return input_name.lstrip('^').split(':')[0]


def _reduce_as_while_loop(node, inputs, control_inputs, functions):
  """Assumption 4: `ReduceDataset` as an iterator and a sequential loop."""
  state_types = list(node.attr['Tstate'].list.type)
  argument_types = list(node.attr['Targuments'].list.type)
  state_shapes = [tf.TensorShape(s) for s in node.attr['output_shapes'].list.shape]
  function_name = node.attr['f'].func.name
  signature = functions[function_name].signature
  n_state, n_args = len(state_types), len(argument_types)
  element_types = [arg.type for arg in
                   signature.input_arg[n_state:len(signature.input_arg) - n_args]]
  element_shapes = [tf.TensorShape(None)] * len(element_types)
  dataset, state, arguments = (inputs[0], inputs[1:1 + n_state],
                               inputs[1 + n_state:])
  with tf.control_dependencies(control_inputs):
    iterator = tf.raw_ops.AnonymousIteratorV3(output_types=element_types,
                                              output_shapes=element_shapes)
    make = tf.raw_ops.MakeIterator(dataset=dataset, iterator=iterator)

  def call_f(state, elements):
    outputs = tf.raw_ops.StatefulPartitionedCall(
        args=list(state) + list(elements) + list(arguments),
        Tout=state_types, f=function_name)
    for output, shape in zip(outputs, state_shapes):
      output.set_shape(shape)
    return list(outputs)

  def body(done, *state):
    del done
    optional = tf.raw_ops.IteratorGetNextAsOptional(
        iterator=iterator, output_types=element_types,
        output_shapes=element_shapes)
    has_value = tf.raw_ops.OptionalHasValue(optional=optional)

    def step():
      elements = tf.raw_ops.OptionalGetValue(
          optional=optional, output_types=element_types,
          output_shapes=element_shapes)
      return call_f(state, elements)

    new_state = tf.cond(has_value, step, lambda: list(state))
    if not isinstance(new_state, (list, tuple)):
      new_state = [new_state]
    return [tf.logical_not(has_value)] + list(new_state)

  with tf.control_dependencies([make]):
    done = tf.constant(False)
  outputs = tf.while_loop(
      lambda done, *state: tf.logical_not(done), body,
      [done] + list(state),
      shape_invariants=[tf.TensorShape([])] + state_shapes,
      parallel_iterations=1)
  return list(outputs[1:])


def _import(graph_def, input_map, return_elements):
  """`import_graph_def`, with top-level dataset reductions rewritten."""
  reduces = {n.name for n in graph_def.node if n.op in _REDUCE_OPS}
  nodes = {n.name: n for n in graph_def.node}
  functions = {f.signature.name: f for f in graph_def.library.function}
  imported = {}  # Original node name -> its op in this graph.
  reduced = {}  # Reduce node name -> its output tensors.
  first = True
  # Placeholders fed through `input_map`: a control input on one means one
  # on the tensor fed (the imported placeholder itself is never fed).
  mapped_ops = {_node_name(k): v for k, v in input_map.items()}

  def control_op(source):
    if source in mapped_ops:
      return mapped_ops[source].op
    return imported[source] if source in imported else tf.group(
        reduced[source])

  while len(imported) + len(reduced) < len(nodes):
    # Nodes with no pending reduction among their ancestors.
    blocked = {}

    def is_blocked(name):
      # Depth-first over the inputs, iteratively: graphs with long chains
      # (e.g. the audit's canaries) exceed Python's recursion limit. Each
      # node is expanded once: a MapReduceForm's while loops are TF1
      # control flow, a cycle (NextIteration -> Merge), around which a
      # node would otherwise be expanded again and again (MemoryError).
      stack = [(name, False)]
      expanded_nodes = set()
      while stack:
        node, expanded = stack.pop()
        if node in blocked or (not expanded and node in expanded_nodes):
          continue
        if node in reduced or node in imported:
          blocked[node] = False
          continue
        if node in reduces:
          blocked[node] = True
          continue
        inputs = [_node_name(i) for i in nodes[node].input]
        if expanded:
          blocked[node] = any(blocked.get(i, False) for i in inputs)
        else:
          expanded_nodes.add(node)
          stack.append((node, True))
          stack.extend((i, False) for i in inputs if i not in blocked)
      return blocked[name]

    ready = [n for n in graph_def.node
             if n.name not in imported and n.name not in reduced and
             not is_blocked(n.name)]
    if ready:
      sub = tf.compat.v1.GraphDef()
      sub.versions.CopyFrom(graph_def.versions)
      if first:
        sub.library.CopyFrom(graph_def.library)
        first = False
      ready_names = {n.name for n in ready}
      sub.node.extend(ready)
      for node in sub.node:
        # Colocation hints may name nodes of another import phase.
        if '_class' in node.attr:
          del node.attr['_class']
      sub_map = {}
      for node in ready:
        for input_name in node.input:
          source = _node_name(input_name)
          canonical = (input_name if ':' in input_name or
                       input_name.startswith('^') else f'{input_name}:0')
          if canonical in input_map:
            sub_map[canonical] = input_map[canonical]
          elif input_name.startswith('^') and source in mapped_ops:
            sub_map[input_name] = mapped_ops[source]
          elif source in ready_names or canonical in sub_map:
            continue
          elif input_name.startswith('^'):
            # A control input: remapped to a tensor that depends on it.
            with tf.control_dependencies([control_op(source)]):
              sub_map[input_name] = tf.constant(0)
          else:
            index = int(canonical.split(':')[1])
            sub_map[canonical] = (imported[source].outputs[index]
                                  if source in imported else
                                  reduced[source][index])
      ops = tf.graph_util.import_graph_def(
          sub, input_map=sub_map, return_elements=[n.name for n in ready],
          name='piece')
      imported.update(zip([n.name for n in ready], ops))
    for name in sorted(reduces - set(reduced)):
      node = nodes[name]
      sources = [_node_name(i) for i in node.input]
      if all(s in imported or s in reduced or _canonical(i) in input_map
             for s, i in zip(sources, node.input)):
        data_inputs, control_inputs = [], []
        for input_name, source in zip(node.input, sources):
          if _canonical(input_name) in input_map:
            data_inputs.append(input_map[_canonical(input_name)])
          elif input_name.startswith('^'):
            control_inputs.append(control_op(source))
          else:
            index = int(input_name.split(':')[1]) if ':' in input_name else 0
            data_inputs.append(imported[source].outputs[index]
                               if source in imported else
                               reduced[source][index])
        reduced[name] = _reduce_as_while_loop(node, data_inputs,
                                              control_inputs, functions)
  results = []
  for element in return_elements:
    name = _node_name(element)
    if ':' in element:
      index = int(element.split(':')[1])
      results.append(imported[name].outputs[index] if name in imported
                     else reduced[name][index])
    else:
      results.append(imported[name] if name in imported
                     else tf.group(reduced[name]))
  return results


def call_flat(concrete_function, tensors):
  """Assumption 6: `ConcreteFunction._call_flat(args, captured_inputs)`.

  The public call first tries to bind the arguments to a structured
  signature, which a pruned function does not have; formatting that failure
  costs milliseconds per call.
  """
  return concrete_function._call_flat(  # pylint: disable=protected-access
      tensors, concrete_function.captured_inputs)


class TensorFlowFunction:
  """One TFF TensorFlow computation, callable on flat leaves in this process.

  `__call__(*leaves)` takes the parameter's leaves in TFF-type order
  (`flatten_value`), runs the computation's initializer and then the
  computation, and returns the result's leaves as eager tensors.

  The graph is imported into a TensorFlow function on the first call (most
  of the cost, ~0.1 s for a model's client work): a runner holds functions
  one execution path never calls (the batched cohort calls neither the
  per-client work nor the accumulation).
  """

  def __init__(self, computation):
    """`computation`: a `tff.Computation`, or its serialized `pb.Computation`
    (`tff.framework.serialize_computation`)."""
    if isinstance(computation, pb.Computation):
      proto = computation
      type_signature = type_serialization.deserialize_type(proto.type)
    else:
      proto = tff.framework.serialize_computation(computation)
      type_signature = computation.type_signature
    if proto.WhichOneof('computation') != 'tensorflow':
      raise ValueError(
          'Only TensorFlow computations run in-process; got a '
          f'{proto.WhichOneof("computation")} computation of type '
          f'{type_signature}.')
    tf_proto = proto.tensorflow
    self.type_signature = type_signature
    graph_def = tf.compat.v1.GraphDef()
    tf_proto.graph_def.Unpack(graph_def)
    graph_def = _rename_functions(graph_def, f'inproc{next(_counter)}')
    parameter_names = (_binding_names(tf_proto.parameter, [])
                       if tf_proto.HasField('parameter') else [])
    result_names = _binding_names(tf_proto.result, [])
    init_name = tf_proto.initialize_op or None
    token_name = tf_proto.session_token_tensor_name or None
    nodes = {n.name: n for n in graph_def.node}

    def spec(tensor_name):
      node = nodes[_node_name(tensor_name)]
      dtype = tf.dtypes.as_dtype(node.attr['dtype'].type)
      shape = (tf.TensorShape(node.attr['shape'].shape)
               if 'shape' in node.attr else tf.TensorShape(None))
      return tf.TensorSpec(shape, dtype)

    signature = [spec(name) for name in parameter_names]

    def importer(return_elements):
      # Only the nodes the returned ones need (TF's `prune`, on the
      # GraphDef: a stateful op left in a function body runs on every call,
      # so the initializer must not be in the computation's, nor it in the
      # initializer's).
      sub = graph_defs.subgraph(graph_def, return_elements)
      present = {n.name for n in sub.node}
      fed = [(i, _canonical(n)) for i, n in enumerate(parameter_names)
             if _node_name(n) in present]

      def imported(*args):
        input_map = {name: args[i] for i, name in fed}
        if token_name and _node_name(token_name) in present:
          input_map[_canonical(token_name)] = tf.constant('in-process')
        return list(_import(sub, input_map, return_elements))
      return imported

    def initialize(*args):
      (op,) = importer([init_name])(*args)
      with tf.control_dependencies([op]):
        return [tf.constant(0)]

    self._importers = (importer(list(result_names)),
                       initialize if init_name else None)
    self._functions_built = None
    self._specs = signature
    self.num_parameters = len(parameter_names)
    self.num_results = len(result_names)

  def tensors(self, leaves) -> list:
    """The first len(`leaves`) parameter leaves as tensors of their dtypes
    (a caller passing the same leaves to several calls converts them once)."""
    return [
        leaf if isinstance(leaf, tf.Tensor) else tf.constant(leaf, spec.dtype)
        for leaf, spec in zip(leaves, self._specs)]

  def _functions(self):
    """(run, init or None): the graph's parts imported, once."""
    if self._functions_built is None:
      with _IMPORTING:
        if self._functions_built is None:
          self._functions_built = tuple(
              None if part is None else
              tf.compat.v1.wrap_function(part, self._specs)
              for part in self._importers)
    return self._functions_built

  def __call__(self, *leaves):
    if len(leaves) != self.num_parameters:
      raise TypeError(f'Expected {self.num_parameters} leaves for '
                      f'{self.type_signature}; got {len(leaves)}.')
    tensors = self.tensors(leaves)
    run, init = self._functions()
    if init is not None:
      call_flat(init, tensors)
    return call_flat(run, tensors)

