"""What the stack tells the people who run it: Prometheus metrics from every worker and the Prometheus that scrapes
them, and one OpenTelemetry trace per trajectory with the timeline `trajflow trace` prints."""
