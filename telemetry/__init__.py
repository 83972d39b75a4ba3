"""What the stack tells the people who run it: Prometheus metrics from every worker, and the Prometheus that scrapes them."""
