"""The runtime's version (as pyproject.toml states it): recorded with each calibration, shown by the web API."""

__version__ = "0.1.0"
