"""A local Ray cluster of three nodes, run in a process of its own for test_ray.

Built in pytest's process, the cluster's GCS client (grpc pollers and timers, native threads) lives
on after the cluster is shut down, talking to a dead server for the rest of the test session.
Here it dies with this process. Prints the cluster's address once every node is up, then holds
the cluster until stdin closes.
"""

import sys

from ray.cluster_utils import Cluster


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head_node": 1}, "object_store_memory": 100 << 20})
    try:
        cluster.add_node(num_cpus=2, resources={"inference_node": 1}, object_store_memory=100 << 20)
        cluster.add_node(num_cpus=2, resources={"train_node": 1}, object_store_memory=100 << 20)
        cluster.wait_for_nodes()
        print("address", cluster.address, flush=True)
        sys.stdin.read()
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
