"""Privacy-vs-speed benchmark harness."""
