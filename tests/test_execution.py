"""Specification of the execution contexts (`tff_clip.runtime.execution`)."""

import os
import select
import shutil
import stat
import subprocess
import sys

import grpc
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_clip.runtime import execution
import as_a_user  # pylint: disable=g-bad-import-order
import worker_network  # pylint: disable=g-bad-import-order


def test_replacing_the_local_context_stops_its_worker():
  @tff.tensorflow.computation
  def one():
    return np.float32(1.0)

  for _ in range(3):  # E.g. three training runs in one process.
    execution.set_local_cpp_context()
    assert one() == 1.0
  assert len(worker_network.worker_binaries()) == 1


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
# Who can reach a worker. The one `--executor=local` starts:
# tests/test_split_execution.py::
# test_the_local_worker_is_unreachable_from_the_network_and_the_run_works
# (on the run an attacker watches there).


@pytest.mark.slow  # A test helper's worker, not one the program starts.
def test_a_worker_started_for_remote_use_answers_on_127_0_0_1_only():
  proc, port = execution.start_worker()
  try:
    assert worker_network.grpc_answers('127.0.0.1', port)
    assert not (worker_network.socket_inodes(proc.worker_pid) &
                worker_network.tcp_listening_inodes())
    reached = [a for a in sorted(worker_network.non_loopback_addresses())
               if worker_network.grpc_answers(a, port)]
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
  # -X importtime: Python logs every module it imports to stderr (the oracle
  # that the refusal comes before TensorFlow loads).
  result = subprocess.run(
      _where_no_network_namespace_can_be_made(
          [sys.executable, '-X', 'importtime', '-m', 'scripts.train',
           '--executor=local',
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
  imported = {line.split('|')[-1].strip() for line in
              result.stderr.splitlines() if line.startswith('import time:')}
  assert 'tensorflow' not in imported  # Refused before TensorFlow loads,
  assert 'tff_clip.runtime.worker_isolation' in imported  # by the probe.


def test_a_worker_binary_the_program_started_itself_is_left_alone():
  """Replacing TFF's default context terminates the worker a TFF context
  started (its `__del__` would wait forever for it where SIGINT is ignored:
  tests/test_quiet_imports.py), and no other child named worker_binary: one
  the program started itself is its own. The child says which signal it got
  before it reads the end of its input."""
  child = subprocess.Popen(
      ['bash', '-c', 'exec -a worker_binary "$0" -c "$1"', sys.executable,
       'import signal, sys\n'
       'signal.signal(signal.SIGTERM, lambda *_: print("TERM", flush=True))\n'
       'print("ready", flush=True)\n'
       'sys.stdin.read()\n'
       'print("EOF", flush=True)\n'],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert child.stdout.readline() == 'ready\n'
    with open(f'/proc/{child.pid}/cmdline', 'rb') as f:
      assert f.read().split(b'\0')[0] == b'worker_binary'
    execution.set_local_cpp_context()  # Replaces the default context.
    child.stdin.close()
    assert child.stdout.read().split() == ['EOF']
  finally:
    child.kill()
    child.wait()
