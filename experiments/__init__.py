"""The CPU-scale reproduction study and its probes, run as modules from the repository's root:
python -m experiments.study (see reproduce.sh)."""
