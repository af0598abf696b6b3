#!/usr/bin/env bash
# Reproduce the T2R paper's findings at CPU scale (Table 1, Fig. 4, Figs. 5-6, Table 2) with the study's controls:
# about 18 hours on a 2-core CPU, two runs at a time; stop it at any point (Ctrl-C) and rerun to continue. What a
# fixed state forgets (associative recall) is an experiment of its own, about an hour: python -m experiments.mqar.
# experiments/study.py runs the plan (rerunning skips finished runs, kept in results/runs/ so that another machine
# continues too, and resumes interrupted ones) and gathers the results into results/*.csv; at its end
# experiments/report.py writes results/README.md, results/summary.md and the plots from those CSVs alone. Extra
# flags go to experiments/study.py (try --dry_run, --quick, --jobs 1).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m experiments.study --jobs 2 "$@"
