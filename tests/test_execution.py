"""Specification of the execution contexts (`tff_clip.execution`)."""

import os
import select
import subprocess
import sys

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


def test_a_worker_dies_with_the_process_that_started_it_even_on_sigkill():
  parent = subprocess.Popen(
      [sys.executable, '-c',
       'import sys; from tff_clip import execution; '
       'proc, _ = execution.start_worker(); print(proc.pid, flush=True); '
       'sys.stdin.read()'],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
      text=True)
  worker = int(parent.stdout.readline())
  exited = os.pidfd_open(worker)  # Readable once the worker has exited.
  try:
    parent.kill()
    parent.wait(timeout=60)
    readable, _, _ = select.select([exited], [], [], 60)
    assert readable, 'the worker outlived the process that started it'
  finally:
    os.close(exited)
    parent.stdin.close()
    parent.stdout.close()
