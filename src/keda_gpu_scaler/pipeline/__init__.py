"""The pipeline: the aggregator actor, snapshot publication, supervision."""
