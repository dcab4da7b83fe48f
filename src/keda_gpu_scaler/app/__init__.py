"""The composition root: command line, configuration, wiring of the actors."""
