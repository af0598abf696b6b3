"""The machinery of bench.py: its flags (bench_flags), the floors it measures against (bench_models), timing
(bench_tools) and its tables and plots (bench_report)."""
