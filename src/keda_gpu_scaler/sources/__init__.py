"""Samplers: actors that read GPUs (or recordings of them) and publish typed samples."""
