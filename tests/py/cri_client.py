"""A grpc-core client of the CRI (Python grpcio, DEFAULT channel options:
its :authority is the socket path). Generates the CRI stubs from crust's
api/proto with grpcio-tools, makes the calls named on the command line
and prints their answers as JSON.

usage: cri_client.py PROTO_ROOT SOCKET
"""

import json
import sys
import tempfile

import grpc
from grpc_tools import protoc

proto_root, socket = sys.argv[1], sys.argv[2]
out = tempfile.mkdtemp(prefix="crust-cri-stubs-")
for proto in ("runtime/v1/api.proto", "runtime/v1alpha2/api.proto"):
    code = protoc.main(
        ["protoc", f"-I{proto_root}", f"--python_out={out}", f"--grpc_python_out={out}", proto]
    )
    if code != 0:
        sys.exit(f"protoc {proto} failed: {code}")
sys.path.insert(0, out)

from runtime.v1 import api_pb2 as v1, api_pb2_grpc as v1_grpc  # noqa: E402
from runtime.v1alpha2 import api_pb2 as v1a2, api_pb2_grpc as v1a2_grpc  # noqa: E402

channel = grpc.insecure_channel("unix:" + socket)
rt = v1_grpc.RuntimeServiceStub(channel)
rt_alpha = v1a2_grpc.RuntimeServiceStub(channel)
answer = {}
pods = rt.ListPodSandbox(v1.ListPodSandboxRequest(), timeout=10)
answer["pods"] = [p.id for p in pods.items]
# A second call on the same connection: the HPACK dynamic table is in use.
pods = rt.ListPodSandbox(v1.ListPodSandboxRequest(), timeout=10)
answer["pods_again"] = [p.id for p in pods.items]
answer["version"] = rt.Version(v1.VersionRequest(), timeout=10).runtime_api_version
answer["version_v1alpha2"] = rt_alpha.Version(v1a2.VersionRequest(), timeout=10).runtime_api_version
try:
    rt.ContainerStatus(v1.ContainerStatusRequest(container_id="nonexistent"), timeout=10)
    answer["unknown_container"] = "OK"
except grpc.RpcError as e:
    answer["unknown_container"] = e.code().name
json.dump(answer, sys.stdout)
