"""Seeing where the time goes: step traces (trace), their report (step_report, step_model), flight
records (flight), the link probe (probe, probe_report, placement) and guarded compression's
metrics (guard_metrics)."""
