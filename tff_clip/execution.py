"""Execution contexts: TFF's C++ runtime, with workers that never outlive us.

TFF 0.87's `tff.backends.native.set_sync_local_cpp_execution_context` starts
its C++ `worker_binary` as a child process and relies on a `__del__` to stop
it; at interpreter shutdown that `__del__` fails (the `subprocess` module is
already torn down) and the worker is leaked, holding the parent's stdout and
stderr open -- a test runner or CI harness that waits for EOF then hangs. A
process killed with SIGKILL leaks it too. `set_local_cpp_context` builds the
same stack from TFF's public pieces (`tff.framework.RemoteExecutor` over a
gRPC stub to the same binary) but starts the worker with
`PR_SET_PDEATHSIG`, so the kernel stops it when its parent dies, however it
dies, and without our stdout/stderr.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import tensorflow_federated as tff

__all__ = [
    'close_tff_context_at_exit',
    'create_remote_async_context',
    'local_worker_binary',
    'local_worker_targets',
    'set_local_cpp_context',
    'start_worker',
]

_GRPC_MAX_MESSAGE_LENGTH_BYTES = 2 * 1000 * 1000 * 1000
GRPC_CHANNEL_OPTIONS = (
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_LENGTH_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_LENGTH_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_LENGTH_BYTES),
)
_started = []
_lock = threading.Lock()


def local_worker_binary() -> str:
  """Path of the C++ `worker_binary` shipped inside the TFF wheel."""
  path = os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')
  if not os.path.isfile(path):
    raise RuntimeError(f'TFF worker binary not found at {path}.')
  return path


# Starts the worker so that it dies with this process: sets the parent-death
# signal (PR_SET_PDEATHSIG, kept across exec), checks the parent is still the
# one that launched it, then becomes the worker binary. A separate program,
# not a `preexec_fn`: Python code between fork and exec forces a real fork(),
# whose gRPC fork handlers can abort the child while this process's gRPC
# threads are busy (worker exit code -6).
_LAUNCHER = """
import ctypes, os, signal, sys
try:
  ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)  # 1: PDEATHSIG
except OSError:
  pass
if os.getppid() != int(sys.argv[1]):
  sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def start_worker(port: int | None = None,
                 max_concurrent_computation_calls: int = -1,
                 log_path: str | None = None) -> tuple[subprocess.Popen, int]:
  """Starts TFF's C++ worker on `port` (picked when None); returns (proc, port).

  The worker dies with this process (PR_SET_PDEATHSIG) and is stopped at exit.
  Its output goes to `log_path` (or nowhere), never to our stdout/stderr.
  """
  port = port or _unused_port()
  args = [local_worker_binary(), f'--port={port}',
          f'--max_concurrent_computation_calls={max_concurrent_computation_calls}']
  if sys.platform.startswith('linux'):
    args = [sys.executable, '-S', '-c', _LAUNCHER, str(os.getpid()), *args]
  out = open(log_path, 'ab') if log_path else subprocess.DEVNULL  # pylint: disable=consider-using-with
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
      args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
      close_fds=True)
  with _lock:
    _started.append(proc)
  return proc, port


_current_local = {}


def _unused_port() -> int:
  """A TCP port no process listens on now (the kernel's pick for port 0)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _close_tff_context_at_exit():
  """Stops TFF's default C++ worker while the interpreter is still whole.

  TFF 0.87 sets a local C++ context on import and stops its worker in a
  `__del__` that runs only at interpreter teardown, when `subprocess` is
  already gone: it prints "Exception ignored ... ServiceManager.__del__" and
  leaks the worker, which holds our stdout open (a pipe reading a script's
  output then never ends). Replacing the default context at exit drops the
  old one while modules still work.
  """

  class _ClosedContext(tff.framework.SyncContext):

    def invoke(self, comp, arg):
      raise RuntimeError('The TFF context was closed at interpreter exit.')

  try:
    tff.framework.set_default_context(_ClosedContext())
  except Exception:  # pylint: disable=broad-except
    pass  # Never let exit clean-up raise.


def close_tff_context_at_exit() -> None:
  """Registers (once) the exit hook that stops TFF's default C++ worker.

  Called by this module when it creates a context, and by the entry points;
  importing `tff_clip` registers nothing.
  """
  with _lock:
    if _current_local.get('exit_hook'):
      return
    _current_local['exit_hook'] = True
  atexit.register(_close_tff_context_at_exit)


def _stop(proc):
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      proc.kill()


@atexit.register
def _stop_workers():
  for proc in list(_started):
    _stop(proc)


def _wait_ready(stub, target: str, timeout_s: float, proc=None):
  deadline = time.monotonic() + timeout_s
  while not stub.is_ready:
    if proc is not None and proc.poll() is not None:
      raise RuntimeError(f'TFF worker for {target} exited with code '
                         f'{proc.returncode} before it was ready.')
    if time.monotonic() > deadline:
      raise TimeoutError(
          f'TFF worker at {target} did not answer within {timeout_s:.0f} s. '
          'Is `worker_binary --port=PORT` running there and reachable?')
    time.sleep(0.1)


def _executor_factory(get_stub, default_num_clients: int):
  def stack_fn(cardinalities):
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = default_num_clients
    executor = tff.framework.RemoteExecutor(get_stub())
    executor.set_cardinalities(cardinalities)
    return executor
  return tff.framework.ResourceManagingExecutorFactory(stack_fn)


def _context_kwargs():
  return dict(
      compiler_fn=tff.backends.native.desugar_and_transform_to_native,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result,
  )


def set_local_cpp_context(max_concurrent_clients: int | None = None,
                          default_num_clients: int = 0) -> None:
  """Sets TFF's default context to the local C++ runtime (one worker process).

  Args:
    max_concurrent_clients: at most this many client computations run at once
      in the worker (None: no limit). Lower it to bound memory.
    default_num_clients: CLIENTS cardinality when it cannot be inferred.
  """
  close_tff_context_at_exit()
  if max_concurrent_clients is not None and max_concurrent_clients <= 0:
    raise ValueError('`max_concurrent_clients` must be positive or None; got '
                     f'{max_concurrent_clients}.')
  limit = -1 if max_concurrent_clients is None else int(max_concurrent_clients)
  # The context this call replaces is never used again: stop its worker now
  # (each holds its own TF runtime, ~2 GB for a CNN), not at exit.
  with _lock:
    previous = _current_local.pop('holder', None)
  if previous is not None and previous.get('proc') is not None:
    _stop(previous['proc'])
  holder = {}
  with _lock:
    _current_local['holder'] = holder

  def get_stub():
    stub = holder.get('stub')
    if stub is not None and stub.is_ready:
      return stub
    old = holder.get('proc')
    if old is not None and old.poll() is None:
      old.terminate()
      old.wait()
    proc, port = start_worker(max_concurrent_computation_calls=limit)
    target = f'localhost:{port}'
    stub = tff.framework.RemoteExecutorGrpcStub(
        grpc.insecure_channel(target, GRPC_CHANNEL_OPTIONS))
    _wait_ready(stub, target, timeout_s=60, proc=proc)
    holder.update(stub=stub, proc=proc, target=target)
    return stub

  context = tff.framework.SyncExecutionContext(
      executor_fn=_executor_factory(get_stub, default_num_clients),
      **_context_kwargs())
  tff.framework.set_default_context(context)


def local_worker_targets() -> list[str]:
  """'host:port' of the worker of the current local context (if started)."""
  with _lock:
    holder = _current_local.get('holder', {})
  return [holder['target']] if 'target' in holder else []


def create_remote_async_context(target: str, timeout_s: float = 30.0,
                                default_num_clients: int = 0):
  """An async context driving one remote TFF worker at `target` ('host:port').

  Raises `ConnectionError` naming the target at once when nothing listens
  there, and `TimeoutError` when it does not answer within `timeout_s`
  seconds, before any computation is sent.
  """
  close_tff_context_at_exit()
  host, _, port = target.rpartition(':')
  try:  # Fail at once on a refused or unroutable address, not after timeout_s.
    socket.create_connection((host, int(port)), timeout=min(5.0, timeout_s)
                             ).close()
  except OSError as e:
    raise ConnectionError(f'TFF worker at {target} is unreachable ({e}).'
                          ) from None
  stub = tff.framework.RemoteExecutorGrpcStub(
      grpc.insecure_channel(target, GRPC_CHANNEL_OPTIONS))
  _wait_ready(stub, target, timeout_s)
  return tff.framework.AsyncExecutionContext(
      executor_fn=_executor_factory(lambda: stub, default_num_clients),
      **_context_kwargs())
