"""Execution contexts: TFF's C++ runtime, with workers that never outlive us
and that no other host can reach.

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

The binary's only flag is `--port`: it serves gRPC on every interface of its
network, without TLS or authentication, and anyone who reaches the port can
read the values it holds (model weights, the round's sums before the
server's DP noise). So every worker this module starts runs in a network
namespace of its own, whose only interface is a private loopback: no
address of this host leads to its port. A small relay in the same namespace
joins it to a socket made here, in the host's network: a Unix socket in a
directory only this user can open (`set_local_cpp_context`), or a TCP port
on 127.0.0.1 (`start_worker`, a stand-in for a remote worker). A machine that
cannot make the namespace (Linux without unprivileged user namespaces, or
another OS) gets a `WorkerIsolationError`, never an exposed worker.
"""

from __future__ import annotations

import atexit
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import tensorflow_federated as tff

import tff_clip
from tff_clip.runtime.worker_isolation import LAUNCHER
from tff_clip.runtime.worker_isolation import network_isolation_error
from tff_clip.runtime.worker_isolation import refusal
from tff_clip.runtime.worker_isolation import WorkerIsolationError

__all__ = [
    'WorkerIsolationError',
    'close_tff_context_at_exit',
    'create_remote_async_context',
    'local_worker_binary',
    'local_worker_targets',
    'network_isolation_error',
    'set_default_context',
    'set_local_cpp_context',
    'start_private_worker',
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


def _worker_args(max_concurrent_computation_calls: int) -> list[str]:
  limit = max_concurrent_computation_calls
  return [local_worker_binary(), f'--max_concurrent_computation_calls={limit}']


def _launch(listener: socket.socket, worker_args: list[str],
            log_path: str | None, socket_path: str = '') -> subprocess.Popen:
  """Starts the launcher serving `listener` (which it takes over)."""
  if not sys.platform.startswith('linux'):
    listener.close()
    raise refusal(network_isolation_error())
  status_read, status_write = os.pipe()
  out = open(log_path, 'ab') if log_path else subprocess.DEVNULL  # pylint: disable=consider-using-with
  try:
    proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, '-S', '-c', LAUNCHER, 'serve', str(os.getpid()),
         str(status_write), str(listener.fileno()), socket_path,
         *worker_args],
        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        pass_fds=(status_write, listener.fileno()))
  finally:  # Only the launcher holds them now: its exit closes the socket.
    os.close(status_write)
    listener.close()
    if log_path:
      out.close()
  proc.socket_dir = os.path.dirname(socket_path) if socket_path else None
  with _lock:
    _started.append(proc)
  with os.fdopen(status_read) as status:
    ready, _, _ = select.select([status], [], [], 60)
    line = status.readline().strip() if ready else ''
  if line.startswith('ready '):
    proc.worker_pid = int(line.split()[1])
    return proc
  _stop(proc)
  if line.startswith('error: '):
    raise refusal(line[len('error: '):])
  raise RuntimeError('The TFF worker launcher did not start the worker '
                     f'within 60 s (exit code {proc.returncode}).')


def start_worker(port: int | None = None,
                 max_concurrent_computation_calls: int = -1,
                 log_path: str | None = None) -> tuple[subprocess.Popen, int]:
  """Starts TFF's C++ worker at 127.0.0.1:`port` only; returns (proc, port).

  `port` is picked when None. The worker itself runs in a network namespace
  of its own, so no other address of this host reaches it; `proc` is its
  launcher (`proc.worker_pid` the worker), which relays 127.0.0.1:`port` to
  it. Stopping or killing `proc` stops the worker, as does this process's
  exit, however it happens. Output goes to `log_path` (or nowhere), never to
  our stdout/stderr. Raises `WorkerIsolationError` where the namespace cannot
  be made.
  """
  listener = socket.create_server(('127.0.0.1', port or 0), backlog=128)
  port = listener.getsockname()[1]
  return _launch(listener, _worker_args(max_concurrent_computation_calls),
                 log_path), port


def start_private_worker(max_concurrent_computation_calls: int = -1,
                         log_path: str | None = None
                         ) -> tuple[subprocess.Popen, str]:
  """Starts TFF's C++ worker behind a Unix socket; returns (proc, target).

  As `start_worker`, but reachable only through the Unix socket `target`
  ('unix:PATH', a gRPC target) in a new directory of mode 0700: by this
  user (and root) on this host, through no network at all. The directory
  is removed when the worker stops.
  """
  directory = tempfile.mkdtemp(prefix='tff_clip_worker_')
  if len(directory) > 80:  # sun_path holds 108 bytes.
    os.rmdir(directory)
    directory = tempfile.mkdtemp(prefix='tff_clip_worker_', dir='/tmp')
  path = os.path.join(directory, 'worker.sock')
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  try:
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(128)
  except OSError:
    listener.close()
    shutil.rmtree(directory, ignore_errors=True)
    raise
  proc = _launch(listener, _worker_args(max_concurrent_computation_calls),
                 log_path, socket_path=path)
  return proc, f'unix:{path}'


_current_local = {}


def close_tff_context_at_exit() -> None:
  """Nothing left to do: importing `tff_clip` registers this exit hook.

  The hook (`tff_clip._close_tff_context`) replaces TFF's default context
  at exit while the interpreter is still whole, so TFF's own worker is
  stopped without its "Exception ignored ... ServiceManager.__del__"
  traceback. Kept for the callers of earlier versions.
  """


def _stop(proc):
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(timeout=10)  # The launcher stops its worker first.
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
  if getattr(proc, 'socket_dir', None):  # Killed: it could not remove it.
    shutil.rmtree(proc.socket_dir, ignore_errors=True)


@atexit.register
def _stop_workers():
  # The context first (again at the very end: harmless), while the workers
  # its executors talk to still run.
  tff_clip._close_tff_context()  # pylint: disable=protected-access
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

  The worker (`start_private_worker`, started at the first computation) is
  reachable through a Unix socket only, by this user on this host.

  Args:
    max_concurrent_clients: at most this many client computations run at once
      in the worker (None: no limit). Lower it to bound memory.
    default_num_clients: CLIENTS cardinality when it cannot be inferred.

  Raises:
    WorkerIsolationError: this machine cannot give the worker a network of
      its own (`network_isolation_error`); no worker is started.
  """
  if max_concurrent_clients is not None and max_concurrent_clients <= 0:
    raise ValueError('`max_concurrent_clients` must be positive or None; got '
                     f'{max_concurrent_clients}.')
  reason = network_isolation_error()
  if reason is not None:  # Refused now, not at the first computation.
    raise refusal(reason)
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
    if old is not None:
      _stop(old)
    proc, target = start_private_worker(max_concurrent_computation_calls=limit)
    stub = tff.framework.RemoteExecutorGrpcStub(
        grpc.insecure_channel(target, GRPC_CHANNEL_OPTIONS))
    _wait_ready(stub, target, timeout_s=60, proc=proc)
    holder.update(stub=stub, proc=proc, target=target)
    return stub

  context = tff.framework.SyncExecutionContext(
      executor_fn=_executor_factory(get_stub, default_num_clients),
      **_context_kwargs())
  set_default_context(context)


def set_default_context(context) -> None:
  """`tff.framework.set_default_context`, TFF's own worker stopped first.

  The context replaced is dropped, and TFF's local and test contexts stop
  their worker in a `__del__` that sends SIGINT and waits: in a process
  started with SIGINT ignored (nohup, a background job) the worker ignores
  it too, and the wait never ends. Terminated first
  (`tff_clip._terminate_tff_default_workers`), it is reaped at once.
  """
  tff_clip._terminate_tff_default_workers()  # pylint: disable=protected-access
  tff.framework.set_default_context(context)


def local_worker_targets() -> list[str]:
  """gRPC target ('unix:PATH') of the current local context's worker, if any."""
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
