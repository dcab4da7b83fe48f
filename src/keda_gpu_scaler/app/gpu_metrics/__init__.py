"""`gpu-metrics`: this node's GPUs, on Kubernetes, Slurm, Flux or a host, and `record`."""
