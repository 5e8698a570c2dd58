"""TensorFlow `GraphDef` surgery: renamed functions, a subgraph, and a
canonical form.

`subgraph` keeps the nodes some nodes need (TF's `prune`, before an
import). `apply_renames` renames a graph's library functions and every reference to
them (`tff_clip.runtime.tf_graphs` gives each import of a graph its own
names). `canonical_digest` hashes what a TFF computation computes, the same
for every trace of the same code: TensorFlow names each traced function with
a process-wide counter, so two traces differ in their bytes, never in their
canonical form (`tff_clip.program.hyperparameters` compares graphs with it).
"""

from __future__ import annotations

import hashlib

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2 as pb

__all__ = ['apply_renames', 'canonical_digest', 'subgraph']


def _rename_attr(attr, renames):
  if attr.HasField('func'):
    _rename_name_attr_list(attr.func, renames)
  for func in attr.list.func:
    _rename_name_attr_list(func, renames)


def _rename_name_attr_list(func, renames):
  if func.name in renames:
    func.name = renames[func.name]
  for value in func.attr.values():
    _rename_attr(value, renames)


def subgraph(graph_def, names):
  """`graph_def` with only the nodes `names` (tensor or op names) need, by
  their inputs, data and control, transitively (its functions kept)."""
  def node_name(name):
    return name.lstrip('^').split(':')[0]
  nodes = {n.name: n for n in graph_def.node}
  needed, pending = set(), [node_name(name) for name in names]
  while pending:
    name = pending.pop()
    if name not in needed:
      needed.add(name)
      pending.extend(node_name(i) for i in nodes[name].input)
  sub = tf.compat.v1.GraphDef()
  sub.versions.CopyFrom(graph_def.versions)
  sub.library.CopyFrom(graph_def.library)
  sub.node.extend(n for n in graph_def.node if n.name in needed)
  return sub


def apply_renames(graph_def, renames):
  """Renames the library's functions (`renames`: old -> new name) and every
  reference to them, in place."""
  for function in graph_def.library.function:
    function.signature.name = renames[function.signature.name]
    for node in function.node_def:
      node.op = renames.get(node.op, node.op)
      for attr in node.attr.values():
        _rename_attr(attr, renames)
    for attr in function.attr.values():
      _rename_attr(attr, renames)
  for gradient in graph_def.library.gradient:
    gradient.function_name = renames.get(gradient.function_name,
                                         gradient.function_name)
    gradient.gradient_func = renames.get(gradient.gradient_func,
                                         gradient.gradient_func)
  for node in graph_def.node:
    node.op = renames.get(node.op, node.op)
    for attr in node.attr.values():
      _rename_attr(attr, renames)
  return graph_def


def _function_references(nodes, library, order: list) -> list:
  """Appends the library functions `nodes` call, depth first, each once."""
  for node in nodes:
    names = [node.op]
    for key in sorted(node.attr):
      _attr_functions(node.attr[key], names)
    for name in names:
      if name in library and name not in order:
        order.append(name)
        _function_references(library[name].node_def, library, order)
  return order


def _attr_functions(attr, out: list) -> None:
  for func in ([attr.func] if attr.HasField('func') else []) + list(
      attr.list.func):
    out.append(func.name)
    for key in sorted(func.attr):
      _attr_functions(func.attr[key], out)


def _canonical_graph(graph_def) -> bytes:
  """`graph_def` serialized with its functions named by where they are first
  called (`f0`, `f1`, ...) and listed in that order: two traces of the same
  code differ only in their functions' names (a process-wide counter)."""
  graph_def = type(graph_def).FromString(graph_def.SerializeToString())
  library = {f.signature.name: f for f in graph_def.library.function}
  order = _function_references(graph_def.node, library, [])
  order += sorted(set(library) - set(order))  # Called by none.
  renames = {name: f'f{i}' for i, name in enumerate(order)}
  apply_renames(graph_def, renames)
  functions = sorted(graph_def.library.function,
                     key=lambda f: int(f.signature.name[1:]))
  del graph_def.library.function[:]
  graph_def.library.function.extend(functions)
  return graph_def.SerializeToString(deterministic=True)


def canonical_digest(computation) -> str:
  """A digest of what `computation` computes, the same for every trace of it.

  `computation`: a `tff.Computation` or its `pb.Computation`. Every field of
  the serialized computation is hashed as it is, except TensorFlow graphs,
  whose functions are renamed first (`_canonical_graph`). Two computations
  with the same digest run the same graphs on the same inputs; a constant
  baked into one (a noise multiplier, a learning rate) changes it.
  """
  if not isinstance(computation, pb.Computation):
    computation = tff.framework.serialize_computation(computation)
  digest = hashlib.sha256()

  def walk(message):
    for field, value in message.ListFields():
      if field.name == 'graph_def':
        graph_def = tf.compat.v1.GraphDef()
        value.Unpack(graph_def)
        digest.update(_canonical_graph(graph_def))
      elif field.type != field.TYPE_MESSAGE:
        digest.update(repr((field.name, value)).encode())
      else:
        digest.update(field.name.encode())
        for element in (value if field.label == field.LABEL_REPEATED
                        else [value]):
          walk(element)

  walk(computation)
  return digest.hexdigest()
