"""Bad metadata that the Go project rejects or wrongly accepts, with the message we give."""

from __future__ import annotations

BAD_METADATA: list[tuple[dict[str, str], str]] = [
    ({"profile": "nope"}, 'invalid profile "nope": unknown profile (available: '),
    ({"profile": "Training"}, 'invalid profile "Training"'),
    ({"metricType": "gpu_util"}, 'invalid metricType "gpu_util": must be one of gpu_utilization'),
    ({"metricType": "GPU_UTILIZATION"}, 'invalid metricType "GPU_UTILIZATION"'),
    ({"targetValue": "abc"}, 'invalid targetValue "abc": not a number'),
    ({"targetValue": ""}, 'invalid targetValue "": not a number'),
    ({"targetValue": " 80"}, 'invalid targetValue " 80": not a number'),
    ({"targetValue": "8_0"}, 'invalid targetValue "8_0": not a number'),
    ({"targetValue": "NaN"}, 'invalid targetValue "NaN": must be a finite number'),
    ({"targetValue": "Inf"}, 'invalid targetValue "Inf": must be a finite number'),
    ({"targetValue": "-Inf"}, 'invalid targetValue "-Inf": must be a finite number'),
    ({"targetValue": "1e999"}, 'invalid targetValue "1e999": must be a finite number'),
    ({"targetValue": "0"}, 'invalid targetValue "0": must be greater than 0'),
    ({"targetValue": "-5"}, 'invalid targetValue "-5": must be greater than 0'),
    ({"targetGpuUtilization": "0"}, 'invalid targetGpuUtilization "0": must be greater than 0'),
    ({"targetGpuUtilization": "x"}, 'invalid targetGpuUtilization "x": not a number'),
    (
        {"targetMemoryUtilization": "nan"},
        'invalid targetMemoryUtilization "nan": must be a finite number',
    ),
    (
        {"targetMemoryUtilization": "-1"},
        'invalid targetMemoryUtilization "-1": must be greater than 0',
    ),
    ({"activationThreshold": "NaN"}, 'invalid activationThreshold "NaN": must be a finite number'),
    (
        {"activationThreshold": "+Inf"},
        'invalid activationThreshold "+Inf": must be a finite number',
    ),
    ({"activationThreshold": "ten"}, 'invalid activationThreshold "ten": not a number'),
    ({"gpuIndex": "-2"}, 'invalid gpuIndex "-2": must be -1 (all GPUs) or >= 0'),
    ({"gpuIndex": "1.0"}, 'invalid gpuIndex "1.0": not an integer'),
    ({"gpuIndex": "one"}, 'invalid gpuIndex "one": not an integer'),
    ({"aggregation": "median"}, 'invalid aggregation "median": must be one of max, min, avg'),
    ({"aggregation": "MAX"}, 'invalid aggregation "MAX"'),
    ({"pollIntervalSeconds": "0"}, 'invalid pollIntervalSeconds "0": must be at least 1 second'),
    (
        {"pollIntervalSeconds": "-10"},
        'invalid pollIntervalSeconds "-10": must be at least 1 second',
    ),
    ({"pollIntervalSeconds": "1.5"}, 'invalid pollIntervalSeconds "1.5": not an integer'),
    ({"cooldownSeconds": "-1"}, 'invalid cooldownSeconds "-1"'),
    ({"cooldownSeconds": "soon"}, 'invalid cooldownSeconds "soon": not an integer'),
    ({"windowSeconds": "30s"}, 'invalid windowSeconds "30s": not an integer'),
    ({"windowSeconds": "-30"}, 'invalid windowSeconds "-30": must be 0 (off) or a positive'),
    (
        {"windowSeconds": "86400"},
        'invalid windowSeconds "86400": must be at most 3600 seconds (the longest history kept',
    ),
    (
        {"windowAggregation": "median", "windowSeconds": "60"},
        'invalid windowAggregation "median": must be one of avg, max, min, p95, last',
    ),
    ({"metricName": ""}, 'invalid metricName "": must contain a letter or digit'),
    (
        {"metricType": "vllm_queue_depth"},
        'missing vllmEndpoint: metricType "vllm_queue_depth" requires vllmEndpoint',
    ),
    ({"metricType": "vllm_kv_cache_usage", "vllmEndpoint": ""}, "missing vllmEndpoint"),
    (
        {"profile": "triton-request-rate"},
        'missing tritonEndpoint: metricType "triton_request_rate" requires tritonEndpoint',
    ),
    (
        {"vllmEndpoint": "ftp://vllm/metrics"},
        'invalid vllmEndpoint "ftp://vllm/metrics": unsupported scheme "ftp", must be http',
    ),
    ({"vllmEndpoint": "vllm:8000/metrics"}, 'invalid vllmEndpoint "vllm:8000/metrics"'),
    (
        {"vllmEndpoint": "http:///metrics"},
        'invalid vllmEndpoint "http:///metrics": missing hostname',
    ),
    ({"vllmEndpoint": "http://vllm:99999/metrics"}, "invalid URL"),
    (
        {"vllmEndpoint": "http://169.254.169.254/latest/meta-data"},
        "cloud metadata address not allowed: 169.254.169.254",
    ),
    (
        {"tritonEndpoint": "http://169.254.10.1:8002/metrics"},
        "link-local address not allowed: 169.254.10.1",
    ),
    (
        {"tritonEndpoint": "http://[fe80::1]:8002/metrics"},
        "link-local address not allowed: fe80::1",
    ),
    (
        {"tritonEndpoint": "http://[fd00:ec2::254]/"},
        "cloud metadata address not allowed: fd00:ec2::254",
    ),
    (
        {"tritonEndpoint": "http://[::ffff:169.254.169.254]/"},
        "cloud metadata address not allowed: 169.254.169.254",
    ),
    ({"vllmEndpoint": "http://224.0.0.5/"}, "link-local address not allowed: 224.0.0.5"),
    (
        {"vllmEndpoint": "http://metadata.google.internal/computeMetadata/v1/"},
        "cloud metadata hostname not allowed: metadata.google.internal",
    ),
    (
        {"vllmEndpoint": "http://METADATA.GOOG./"},
        "cloud metadata hostname not allowed: metadata.goog",
    ),
    ({"vllmEndpoint": "http://0.0.0.0:8000/"}, "unspecified address not allowed"),
    (
        {"metricType": "trtllm_queue_depth"},
        'missing trtllmEndpoint: metricType "trtllm_queue_depth" requires trtllmEndpoint',
    ),
    (
        {"profile": "dynamo-queue"},
        'missing dynamoEndpoint: metricType "dynamo_queued_requests" requires dynamoEndpoint',
    ),
    (
        {"profile": "llmd-queue"},
        'missing llmdEndpoint: metricType "llmd_queue_size" requires llmdEndpoint',
    ),
    (
        {"trtllmEndpoint": "ftp://trtllm/prometheus/metrics"},
        'invalid trtllmEndpoint "ftp://trtllm/prometheus/metrics": unsupported scheme "ftp"',
    ),
    (
        {"llmdEndpoint": "http://169.254.169.254/metrics"},
        'invalid llmdEndpoint "http://169.254.169.254/metrics": cloud metadata address',
    ),
    (
        {"dynamoEndpoint": "http://[fe80::1]/metrics"},
        'invalid dynamoEndpoint "http://[fe80::1]/metrics": link-local address not allowed',
    ),
    (
        {
            "profile": "dynamo-queue",
            "dynamoEndpoint": "http://dynamo:8000/metrics",
            "dynamoMetricsPrefix": "nim-llm",
        },
        'invalid dynamoMetricsPrefix "nim-llm": must be a Prometheus metric name prefix '
        '([a-zA-Z_:][a-zA-Z0-9_:]*); for this value Dynamo exports "nim_llm_queued_requests": '
        'give "nim_llm"',
    ),
    (
        {
            "profile": "dynamo-queue",
            "dynamoEndpoint": "http://dynamo:8000/metrics",
            "dynamoMetricsPrefix": "1st",
        },
        'invalid dynamoMetricsPrefix "1st": must be a Prometheus metric name prefix',
    ),
    (
        {
            "profile": "dynamo-queue",
            "dynamoEndpoint": "http://dynamo:8000/metrics",
            "dynamoModel": " Qwen/Qwen3-0.6B",
        },
        'invalid dynamoModel " Qwen/Qwen3-0.6B": must not start or end with blanks',
    ),
    (
        {
            "profile": "dynamo-queue",
            "dynamoEndpoint": "http://dynamo:8000/metrics",
            "dynamoModel": "llama\n3",
        },
        'invalid dynamoModel "llama\\n3": must not contain control characters',
    ),
    (
        {
            "profile": "llmd-queue",
            "llmdEndpoint": "http://epp.llm.svc:9090/metrics",
            "inferencePool": "Qwen_Pool",
        },
        'invalid inferencePool "Qwen_Pool": must be an InferencePool\'s name (an RFC 1123',
    ),
    (
        {
            "profile": "llmd-queue",
            "llmdEndpoint": "http://epp.llm.svc:9090/metrics",
            "targetModelName": "   ",
        },
        'invalid targetModelName "   ": must name a model (it is empty)',
    ),
]
