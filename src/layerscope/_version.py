"""The version of layerscope, recorded in every run's ``run.json``."""

__version__ = "0.1.0"
