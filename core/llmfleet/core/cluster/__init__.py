"""The local Kubernetes cluster (DESIGN.md §9): binaries built from Go modules, started by kwokctl.

Public surface:
- `toolchain`: which tools, at which versions, and how each is built (pure data);
- `build.ensure_tools`: builds what is missing into `~/.cache/llmfleet/<tool>-<version>/bin`
  (Prometheus: Debian's package, unpacked); `build.ensure_binary` gives one binary's path;
- `nodes.gpu_node`: the manifest of one fake GPU node;
- `LocalCluster`: up / down / status of one named cluster.
"""

from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.local import ClusterStatus, LocalCluster

__all__ = ["ClusterError", "ClusterStatus", "LocalCluster"]
