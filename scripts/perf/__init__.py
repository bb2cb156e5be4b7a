"""The performance model of one llm8 training step (scripts/perf_model.py is its entry point): assumptions
(hardware rates, efficiencies, overlap), step (reading the trainer's op list and memory plan, timing the
step), calibration (measured rates replacing assumed ones), report (the table, --json, the comparisons)."""
