"""Ways to show a Report: table (terminal), JSON, Prometheus."""
