"""A nested value rebuilt from its flat leaves by a function made once.

`tf_graphs.pack_value` turns a computation's flat result into the value TFF
returns (a learning process's output: its state and metrics, a few dozen
containers). `tf.nest.pack_sequence_as` walks its template anew on every
call, most of a batched round's packing (~0.3 ms of the frontier cell's
round). `builder(template, leaf_type)` walks the template once and returns a
function of the leaves that makes the same containers directly.
"""

from __future__ import annotations

import collections

import tensorflow as tf

__all__ = ['builder']

_MAPPINGS = (dict, collections.OrderedDict)


def _is_attrs(value) -> bool:
  return hasattr(type(value), '__attrs_attrs__')


def _compile(node, leaf_type):
  """`leaves -> node` with each `leaf_type` node's `index`-th leaf, or None
  where `node` holds a container other than a list, tuple, namedtuple,
  attrs class, dict or OrderedDict."""
  if isinstance(node, leaf_type):
    index = node.index
    return lambda leaves: leaves[index]
  kind = type(node)
  if kind in _MAPPINGS:
    keys = list(node)
    parts = [_compile(node[key], leaf_type) for key in keys]
    if None in parts:
      return None
    return lambda leaves: kind(
        [(key, part(leaves)) for key, part in zip(keys, parts)])
  if _is_attrs(node):
    children = [getattr(node, a.name) for a in kind.__attrs_attrs__]
  elif kind in (list, tuple) or (
      isinstance(node, tuple) and hasattr(kind, '_fields')):
    children = list(node)
  else:
    return None
  parts = [_compile(child, leaf_type) for child in children]
  if None in parts:
    return None
  if kind is list:
    return lambda leaves: [part(leaves) for part in parts]
  if kind is tuple:
    return lambda leaves: tuple([part(leaves) for part in parts])
  return lambda leaves: kind(*[part(leaves) for part in parts])


def builder(template, leaf_type):
  """A function of a list of leaves returning `template` with each of its
  `leaf_type` nodes (an object with an `index`, each index once) replaced
  by that leaf: what `tf.nest.pack_sequence_as(template, ...)` makes of the
  leaves in its order. Made once, here, and checked against `tf.nest`'s
  packing; where the template holds a container this module does not make,
  or the two would differ, the function is `tf.nest`'s packing itself."""
  order = tf.nest.flatten(template)
  nest_build = lambda leaves: tf.nest.pack_sequence_as(
      template, [leaves[node.index] for node in order])
  build = _compile(template, leaf_type)
  if build is None:
    return nest_build
  by_index = [object() for _ in order]
  try:
    built, expected = build(by_index), nest_build(by_index)
    tf.nest.assert_same_structure(built, expected, check_types=True)
  except (TypeError, ValueError, IndexError):
    return nest_build
  if any(a is not b for a, b in zip(tf.nest.flatten(built),
                                     tf.nest.flatten(expected),
                                     strict=True)):
    return nest_build
  return build
