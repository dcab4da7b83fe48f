"""keda-gpu-scaler: a KEDA External Scaler driven by what GPUs and inference engines do."""

__version__ = "0.1.0"
