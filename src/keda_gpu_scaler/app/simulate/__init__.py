"""`keda-gpu-scaler simulate`: a ScaledObject through KEDA and the HPA, in virtual time."""
