"""Inference-engine samplers: scrape the Prometheus endpoint of vLLM, Triton, TGI, SGLang,
TensorRT-LLM, the NVIDIA Dynamo frontend and the llm-d router over HTTP.

``promtext`` parses the exposition format, ``extract`` turns samples into typed readings
(with ``trtllm``, ``dynamo`` and ``llmd`` for those engines, and ``fields`` for what every
extractor shares), ``window`` holds the counter and histogram arithmetic, ``http`` fetches
payloads safely (SSRF checks, pinned addresses, size and time caps) and ``sampler`` is the
actor that ties them together at a steady cadence.
"""
