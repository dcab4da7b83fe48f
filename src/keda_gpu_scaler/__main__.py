try:
    from keda_gpu_scaler.app.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command loads: quiet, like Ctrl-C later
    raise SystemExit(130) from None

raise SystemExit(main())
