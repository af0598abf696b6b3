"""The machinery of bench.py: the floors it measures against (bench_models), timing (bench_tools) and its
tables and plots (bench_report)."""
