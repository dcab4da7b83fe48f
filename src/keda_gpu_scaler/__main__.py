from keda_gpu_scaler.entry import keda_gpu_scaler

raise SystemExit(keda_gpu_scaler())
