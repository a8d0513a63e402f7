"""The core every mode shares: the result model, the configuration, what a check is given (the
context) and how checks run (the runner)."""
