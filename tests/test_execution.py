"""Specification of the execution contexts (`tff_clip.runtime.execution`)."""

import fcntl
import glob
import ipaddress
import os
import select
import shutil
import socket
import stat
import struct
import subprocess
import sys

import grpc
import numpy as np
import pytest
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.proto.v0 import executor_pb2_grpc
from tensorflow_federated.python.core.impl.executors import value_serialization

from scripts import program
from tff_clip.program import training
from tff_clip.runtime import execution
import as_a_user  # pylint: disable=g-bad-import-order


def test_replacing_the_local_context_stops_its_worker():
  @tff.tensorflow.computation
  def one():
    return np.float32(1.0)

  for _ in range(3):  # E.g. three training runs in one process.
    execution.set_local_cpp_context()
    assert one() == 1.0
  assert len(_worker_binaries()) == 1


def test_a_worker_dies_with_the_process_that_started_it_even_on_sigkill():
  parent = subprocess.Popen(
      [sys.executable, '-c',
       'import sys; from tff_clip.runtime import execution; '
       'tcp, _ = execution.start_worker(); '
       'unix, target = execution.start_private_worker(); '
       'print(tcp.pid, tcp.worker_pid, unix.pid, unix.worker_pid, flush=True); '
       'print(target, flush=True); sys.stdin.read()'],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
      text=True)
  pids = [int(pid) for pid in parent.stdout.readline().split()]
  directory = os.path.dirname(parent.stdout.readline().strip()[len('unix:'):])
  # Launchers and workers; each pidfd is readable once its process exited.
  exited = {pid: os.pidfd_open(pid) for pid in pids}
  try:
    parent.kill()
    parent.wait(timeout=60)
    for pid, pidfd in exited.items():
      readable, _, _ = select.select([pidfd], [], [], 60)
      assert readable, f'{pid} outlived the process that started it'
  finally:
    for pidfd in exited.values():
      os.close(pidfd)
    parent.stdin.close()
    parent.stdout.close()
  assert not os.path.exists(directory)  # Its launcher removed it.


def test_a_private_worker_is_a_socket_only_its_user_opens_removed_at_stop():
  proc, target = execution.start_private_worker()
  path = target[len('unix:'):]
  directory = os.path.dirname(path)
  try:
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.stat(directory).st_uid == os.getuid()
    with grpc.insecure_channel(target) as channel:
      grpc.channel_ready_future(channel).result(timeout=60)
  finally:
    proc.terminate()
    proc.wait(timeout=60)
  assert not os.path.exists(directory)
  with pytest.raises(ProcessLookupError):
    os.kill(proc.worker_pid, 0)  # Stopped (and reaped) with its launcher.


# ----------------------------------------------------------------------------
# Who can reach the worker that `--executor=local` starts.


def _descendants(pid: int) -> list[int]:
  found = []
  for children in glob.glob(f'/proc/{pid}/task/*/children'):
    try:
      with open(children) as f:
        pids = [int(p) for p in f.read().split()]
    except OSError:
      continue  # It exited meanwhile.
    for child in pids:
      found += [child, *_descendants(child)]
  return found


def _cmdline(pid: int) -> list[str]:
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return [a.decode() for a in f.read().split(b'\0') if a]
  except OSError:
    return []


def _worker_binaries() -> dict[int, int]:
  """{pid: --port} of every TFF worker_binary this process started."""
  workers = {}
  for pid in _descendants(os.getpid()):
    args = _cmdline(pid)
    if args and os.path.basename(args[0]) == 'worker_binary':
      ports = [a.split('=', 1)[1] for a in args if a.startswith('--port=')]
      workers[pid] = int(ports[0]) if ports else 10000  # Its default.
  return workers


def _non_loopback_addresses() -> set[str]:
  """This host's own addresses, loopback and link-local left out."""
  found = set()
  for _, name in socket.if_nameindex():  # IPv4: each interface's address.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
      try:
        ifreq = fcntl.ioctl(s, 0x8915, struct.pack('256s', name.encode()))
      except OSError:
        continue  # SIOCGIFADDR: no IPv4 address on it.
      found.add(socket.inet_ntoa(ifreq[20:24]))
  try:
    with open('/proc/net/if_inet6') as f:  # IPv6: one line per address.
      found |= {str(ipaddress.IPv6Address(bytes.fromhex(line.split()[0])))
                for line in f}
  except OSError:
    pass
  try:
    found |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(),
                                                        None)}
  except OSError:
    pass
  return {a for a in found if not ipaddress.ip_address(a).is_loopback
          and not ipaddress.ip_address(a).is_link_local}


def _tcp_listening_inodes() -> set[str]:
  """Inodes of the TCP sockets listening in this process's network."""
  inodes = set()
  for table in ('/proc/self/net/tcp', '/proc/self/net/tcp6'):
    with open(table) as f:
      for row in list(f)[1:]:
        fields = row.split()
        if fields[3] == '0A':  # TCP_LISTEN
          inodes.add(fields[9])
  return inodes


def _socket_inodes(pid: int) -> set[str]:
  inodes = set()
  for fd in glob.glob(f'/proc/{pid}/fd/*'):
    try:
      link = os.readlink(fd)
    except OSError:
      continue
    if link.startswith('socket:['):
      inodes.add(link[len('socket:['):-1])
  return inodes


def _grpc_answers(host: str, port: int) -> bool:
  """Whether a plain gRPC client at host:port gets TFF's executor service."""
  if ':' in host:
    host = f'[{host}]'
  with grpc.insecure_channel(f'{host}:{port}') as channel:
    try:
      grpc.channel_ready_future(channel).result(timeout=3)
    except grpc.FutureTimeoutError:
      return False
    try:
      executor_pb2_grpc.ExecutorGroupStub(channel).GetExecutor(
          executor_pb2.GetExecutorRequest(
              cardinalities=value_serialization.serialize_cardinalities(
                  {tff.CLIENTS: 1})), timeout=10)
    except grpc.RpcError:
      return False
    return True


@pytest.fixture
def restore_local_context():
  yield
  execution.set_local_cpp_context()


def test_the_local_worker_is_unreachable_from_the_network_and_the_run_works(
    tmp_path, restore_local_context):
  del restore_local_context
  summary = program.run(training.TrainConfig(
      rounds=2, clients_per_round=3, eval_every=2, progress=False,
      root_output_dir=str(tmp_path), executor='local'), quiet=True)
  assert summary['rounds'] == 2
  workers = _worker_binaries()  # The run's worker, still up after it.
  assert workers and execution.local_worker_targets()
  listening_here = _tcp_listening_inodes()
  for pid, port in workers.items():
    # No TCP port of it in this host's network at all (meaningful even on a
    # host whose only address is loopback)...
    assert not _socket_inodes(pid) & listening_here, (
        f'worker {pid} listens on a TCP port of this host')
    # ...so a gRPC client on the host's network address gets nothing.
    reached = [a for a in sorted(_non_loopback_addresses())
               if _grpc_answers(a, port)]
    assert not reached, f'worker {pid} answered gRPC at {reached}:{port}'


@pytest.mark.slow  # A test helper's worker, not one the program starts.
def test_a_worker_started_for_remote_use_answers_on_127_0_0_1_only():
  proc, port = execution.start_worker()
  try:
    assert _grpc_answers('127.0.0.1', port)
    assert not _socket_inodes(proc.worker_pid) & _tcp_listening_inodes()
    reached = [a for a in sorted(_non_loopback_addresses())
               if _grpc_answers(a, port)]
    assert not reached, f'the worker answered gRPC at {reached}:{port}'
  finally:
    proc.kill()
    proc.wait()


def _where_no_network_namespace_can_be_made(command):
  """`command` on a machine that cannot make network namespaces.

  This one, when it cannot; else a user namespace that may make no user
  namespace (user.max_user_namespaces=0) and holds no capability: what
  Linux with unprivileged user namespaces turned off gives a user.
  """
  if execution.network_isolation_error() is not None:
    return command
  if not (shutil.which('unshare') and shutil.which('setpriv')):
    pytest.skip('needs unshare and setpriv (util-linux) to refuse itself '
                'network namespaces')
  wrapper = ['unshare', '--user', '--map-root-user', 'sh', '-c',
             'echo 0 > /proc/sys/user/max_user_namespaces && '
             'exec setpriv --inh-caps=-all --bounding-set=-all "$@"', 'sh']
  if subprocess.run([*wrapper, 'true'], capture_output=True,
                    check=False).returncode:
    pytest.skip('cannot make a user namespace to refuse namespaces in')
  return [*wrapper, *command]


def test_a_local_dp_run_is_refused_in_one_line_without_network_namespaces(
    tmp_path):
  result = subprocess.run(
      _where_no_network_namespace_can_be_made(
          [sys.executable, '-m', 'scripts.train', '--executor=local',
           '--noise_multiplier=0.5', '--rounds=1', '--progress=false',
           f'--root_output_dir={tmp_path}']),
      cwd=as_a_user.REPO, env=as_a_user.env(), capture_output=True,
      text=True, timeout=600, check=False)
  assert result.returncode == 2, result.stderr
  errors = [line for line in result.stderr.splitlines()
            if line.startswith('error:')]
  assert len(errors) == 1, result.stderr
  assert errors[0].startswith(
      "error: --executor=local: TFF's C++ worker cannot be given a network "
      'of its own on this machine (unshare(')
  assert errors[0].endswith('Use the default --executor=inprocess, which '
                            'starts no worker.')
  assert not any(tmp_path.iterdir())  # Refused before anything is written.
