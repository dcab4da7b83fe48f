"""The harness of the end-to-end suite: components, PKI, API client, kubelet, workloads."""
