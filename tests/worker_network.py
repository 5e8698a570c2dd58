"""Who can reach a TFF worker: its processes, sockets and addresses.

`worker_binaries()` finds the TFF workers this process started (its
descendants running `worker_binary`); a worker is reachable from the network
if it listens on a TCP port of this host's network (`socket_inodes` against
`tcp_listening_inodes`), and a plain gRPC client at one of this host's own
addresses (`non_loopback_addresses`) gets TFF's executor service
(`grpc_answers`).
"""

import fcntl
import glob
import ipaddress
import os
import socket
import struct

import grpc
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.proto.v0 import executor_pb2_grpc
from tensorflow_federated.python.core.impl.executors import value_serialization


def descendants(pid: int) -> list[int]:
  found = []
  for children in glob.glob(f'/proc/{pid}/task/*/children'):
    try:
      with open(children) as f:
        pids = [int(p) for p in f.read().split()]
    except OSError:
      continue  # It exited meanwhile.
    for child in pids:
      found += [child, *descendants(child)]
  return found


def cmdline(pid: int) -> list[str]:
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return [a.decode() for a in f.read().split(b'\0') if a]
  except OSError:
    return []


def worker_binaries() -> dict[int, int]:
  """{pid: --port} of every TFF worker_binary this process started."""
  workers = {}
  for pid in descendants(os.getpid()):
    args = cmdline(pid)
    if args and os.path.basename(args[0]) == 'worker_binary':
      ports = [a.split('=', 1)[1] for a in args if a.startswith('--port=')]
      workers[pid] = int(ports[0]) if ports else 10000  # Its default.
  return workers


def non_loopback_addresses() -> set[str]:
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


def tcp_listening_inodes() -> set[str]:
  """Inodes of the TCP sockets listening in this process's network."""
  inodes = set()
  for table in ('/proc/self/net/tcp', '/proc/self/net/tcp6'):
    with open(table) as f:
      for row in list(f)[1:]:
        fields = row.split()
        if fields[3] == '0A':  # TCP_LISTEN
          inodes.add(fields[9])
  return inodes


def socket_inodes(pid: int) -> set[str]:
  inodes = set()
  for fd in glob.glob(f'/proc/{pid}/fd/*'):
    try:
      link = os.readlink(fd)
    except OSError:
      continue
    if link.startswith('socket:['):
      inodes.add(link[len('socket:['):-1])
  return inodes


def grpc_answers(host: str, port: int) -> bool:
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
