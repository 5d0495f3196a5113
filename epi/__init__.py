"""epi: energy per inference — the command line root shared by the meter and host halves."""

__version__ = "0.1.0"
