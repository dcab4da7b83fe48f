"""`keda-gpu-scaler serve`, `demo` and `tap`: the scaler's own commands and its composition root."""
