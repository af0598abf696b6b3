#!/usr/bin/env bash
# Reproduce the T2R paper's findings at CPU scale (Table 1, Fig. 4, Figs. 5-6, Table 2): 3 h 15 min on a
# 2-core CPU (measured, README "Results"). Rerunning skips finished runs and resumes an interrupted one; the
# CSVs, plots and results/study.md are rewritten at the end. Extra flags go to experiments/study.py (try
# --dry_run, --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
python experiments/study.py "$@"
