from keda_gpu_scaler.app.cli import main

raise SystemExit(main())
