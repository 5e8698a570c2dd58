"""Specification of the execution contexts (`tff_clip.execution`)."""

import os
import subprocess

import numpy as np
import tensorflow_federated as tff

from tff_clip import execution


def _worker_children():
  out = subprocess.run(['pgrep', '-P', str(os.getpid()), '-f',
                        'worker_binary'], capture_output=True, text=True,
                       check=False).stdout
  return out.split()


def test_replacing_the_local_context_stops_its_worker():
  @tff.tensorflow.computation
  def one():
    return np.float32(1.0)

  for _ in range(3):  # E.g. three training runs in one process.
    execution.set_local_cpp_context()
    assert one() == 1.0
  assert len(_worker_children()) == 1
