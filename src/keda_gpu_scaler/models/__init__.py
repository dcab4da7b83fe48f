"""Models of what runs around the scaler in a cluster, for ``keda-gpu-scaler simulate``:
KEDA's scale loop (``kedaloop``), the HPA controller (``hpa``, its scaling rules in
``hpa_rules``) and how far an ``AverageValue`` trigger can ask (``reach``).

Pure functions and records, like the domain, but not the product's own rules: nothing that
serves KEDA imports them (import-linter), only the simulator.
"""
