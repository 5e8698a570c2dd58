"""Whether TFF's C++ worker can get a network of its own here, asked
without TensorFlow.

TFF's `worker_binary` serves every host that reaches its port, without
authentication. `tff_clip.runtime.execution` therefore starts each worker
inside a network namespace of its own, through `LAUNCHER`, and refuses to
start one where no namespace can be made. This module holds the launcher and
that question (`network_isolation_error`), and imports neither TensorFlow
nor gRPC: the training program asks it before TensorFlow loads, so an
`--executor=local` run on such a machine is refused in a second.
"""

from __future__ import annotations

import functools
import subprocess
import sys

__all__ = ['LAUNCHER', 'WorkerIsolationError', 'executor_refusal',
           'network_isolation_error', 'refusal']


class WorkerIsolationError(RuntimeError):
  """This machine cannot give a TFF worker a network of its own."""


# The launcher of a worker, run as `python -S -c LAUNCHER serve ...` (or
# `... probe`: only steps 1 and its check). It
#   1. enters a new network namespace: `unshare(CLONE_NEWNET)` when it may
#      (CAP_SYS_ADMIN), else together with a new user namespace that maps
#      only our own uid and gid (what `unshare --user --net` does), and
#      brings its loopback up -- the namespace has no other interface;
#   2. sets the parent-death signal (PR_SET_PDEATHSIG) and checks that its
#      parent is still the one that launched it;
#   3. forks the worker binary inside the namespace, with the same signal
#      tied to the launcher, so the chain dies with the training process;
#   4. relays every connection to the listening socket it was handed (made by
#      the parent in the host's network) to the worker's port on the
#      namespace's loopback, until the worker exits or it is stopped (then it
#      stops the worker and removes the Unix socket and its directory).
# A separate program, not a `preexec_fn`: Python code between fork and exec
# forces a real fork(), whose gRPC fork handlers can abort the child while
# this process's gRPC threads are busy (worker exit code -6). The launcher
# imports nothing of gRPC and forks before it starts a thread.
LAUNCHER = r"""
import ctypes, errno, fcntl, os, selectors, signal, socket, struct, sys
import threading, time

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP, PR_SET_PDEATHSIG = 0x8913, 0x8914, 1, 1


def isolate():
  uid, gid = os.getuid(), os.getgid()
  if libc.unshare(CLONE_NEWNET) != 0:
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
      error = ctypes.get_errno()
      hint = {errno.ENOSPC: ', user.max_user_namespaces is reached or 0',
              errno.EPERM: ', user namespaces are not allowed here'
              }.get(error, '')
      raise OSError(f'unshare(CLONE_NEWUSER|CLONE_NEWNET): '
                    f'{os.strerror(error)}{hint}')
    try:
      for name, line in (('setgroups', 'deny'), ('uid_map', f'{uid} {uid} 1'),
                         ('gid_map', f'{gid} {gid} 1')):
        with open('/proc/self/' + name, 'w') as f:
          f.write(line)
    except OSError as e:
      raise OSError(f'mapping our uid in a new user namespace: {e.strerror}')
  try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # lo up
      ifreq = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack('16sh22x', b'lo', 0))
      flags = struct.unpack('16sh22x', ifreq)[1]
      fcntl.ioctl(s, SIOCSIFFLAGS,
                  struct.pack('16sh22x', b'lo', flags | IFF_UP))
  except OSError as e:
    raise OSError(f"bringing up the new network's loopback: {e.strerror}")
  interfaces = sorted(name for _, name in socket.if_nameindex())
  if interfaces != ['lo']:
    raise OSError(f'the new network namespace has interfaces {interfaces}')


def relay(source, sink):
  buffer = memoryview(bytearray(1 << 20))
  try:
    while True:
      size = source.recv_into(buffer)
      if not size:
        break
      sink.sendall(buffer[:size])
  except OSError:
    pass
  for s in (source, sink):  # Either side gone: end the connection.
    try:
      s.shutdown(socket.SHUT_RDWR)
    except OSError:
      pass


def bridge(client, port):
  deadline = time.monotonic() + 120  # The worker may still be starting.
  while True:
    try:
      upstream = socket.create_connection(('127.0.0.1', port))
      break
    except OSError:
      if time.monotonic() > deadline:
        client.close()
        return
      time.sleep(0.02)
  for s in (client, upstream):
    if s.family != socket.AF_UNIX:
      s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  back = threading.Thread(target=relay, args=(upstream, client), daemon=True)
  back.start()
  relay(client, upstream)
  back.join()
  client.close()
  upstream.close()


def serve(parent, status_fd, listen_fd, socket_path, worker_args):
  stopping = []

  def stop(signum, unused_frame):  # Once: a second signal ends no clean-up.
    if not stopping:
      stopping.append(signum)
      raise SystemExit(128 + signum)

  # First of all, so that a stop at any moment still runs the clean-up.
  signal.signal(signal.SIGTERM, stop)
  signal.signal(signal.SIGINT, stop)
  worker, code = None, 0
  try:
    status = os.fdopen(status_fd, 'w')
    try:
      isolate()
    except OSError as e:
      status.write(f'error: {e}\n')
      sys.exit(3)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
      sys.exit(1)
    listener = socket.socket(fileno=listen_fd)
    listener.set_inheritable(False)
    os.set_inheritable(status_fd, False)
    with socket.socket() as s:  # The namespace is ours: any free port.
      s.bind(('127.0.0.1', 0))
      port = s.getsockname()[1]
    launcher = os.getpid()
    # A stop during the fork waits for the parent's clean-up; the child
    # takes the default actions before it may be stopped.
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    worker = os.fork()
    if worker == 0:
      try:
        for signum in signals:
          signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == launcher:
          os.execv(worker_args[0], worker_args + [f'--port={port}'])
      finally:
        os._exit(127)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    status.write(f'ready {worker}\n')
    status.close()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    while True:
      pid, wait_status = os.waitpid(worker, os.WNOHANG)
      if pid:
        worker, code = None, os.waitstatus_to_exitcode(wait_status)
        code = code if code >= 0 else 128 - code
        break
      if selector.select(timeout=0.5):
        try:
          client, _ = listener.accept()
        except OSError:
          continue
        threading.Thread(target=bridge, args=(client, port),
                         daemon=True).start()
  finally:
    if socket_path:  # Nobody can connect any more, nor find where.
      for remove in (os.unlink, os.rmdir):
        try:
          remove(socket_path)
        except OSError:
          pass
        socket_path = os.path.dirname(socket_path)
    if worker:
      os.kill(worker, signal.SIGTERM)
      deadline = time.monotonic() + 5
      while not os.waitpid(worker, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
          os.kill(worker, signal.SIGKILL)
          os.waitpid(worker, 0)
          break
        time.sleep(0.02)
  sys.exit(code)


if sys.argv[1] == 'probe':
  try:
    isolate()
  except OSError as e:
    print(e)
    sys.exit(3)
else:
  serve(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
        sys.argv[6:])
"""


@functools.cache
def network_isolation_error() -> str | None:
  """Why workers cannot get a network of their own here; None when they can.

  Asked once per process, of a launcher that only makes the namespace.
  """
  if not sys.platform.startswith('linux'):
    return f'network namespaces are Linux-only; this is {sys.platform}'
  result = subprocess.run(
      [sys.executable, '-S', '-c', LAUNCHER, 'probe'],
      stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
      check=False)
  if result.returncode == 0:
    return None
  return (result.stdout.strip() or
          f'the namespace probe exited with code {result.returncode}')


def refusal(reason: str) -> WorkerIsolationError:
  return WorkerIsolationError(
      "TFF's C++ worker cannot be given a network of its own on this machine "
      f'({reason}), and without one it would serve every host that reaches '
      'this one, without authentication; allowing unprivileged user '
      'namespaces (sysctl user.max_user_namespaces, '
      'kernel.unprivileged_userns_clone, '
      'kernel.apparmor_restrict_unprivileged_userns) lifts this.')


def executor_refusal(executor: str, error: WorkerIsolationError) -> str:
  """The one line that refuses `--executor=executor` for `error`."""
  return (f'--executor={executor}: {error} Use the default '
          '--executor=inprocess, which starts no worker.')
