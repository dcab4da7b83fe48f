"""The gRPC edge: KEDA's External Scaler contract served from snapshots."""
