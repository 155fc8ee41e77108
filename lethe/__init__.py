"""The two ways to run Lethe on one machine: `make run` (the embedded service: API, worker, a demo model) and
`make demo` (a scripted client of it). They compose the service and the worker; neither imports them back."""
