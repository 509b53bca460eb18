"""Example agent programs for push mode (each runnable as ``python -m arl.agents.examples.<name>``)."""
