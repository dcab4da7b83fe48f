"""Inference-engine samplers: scrape vLLM, Triton, TGI and SGLang ``/metrics`` over HTTP.

``promtext`` parses the exposition format, ``extract`` turns samples into typed readings
(``readings``), ``window`` holds the counter and histogram arithmetic, ``http`` fetches
payloads safely (SSRF checks, pinned addresses, size and time caps) and ``sampler`` is the
actor that ties them together at a steady cadence.
"""
