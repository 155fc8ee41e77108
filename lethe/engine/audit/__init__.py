"""The forgetting audit (SPEC section 5): what a deletion request's records still give away, measured on the base
and the new version (metrics, secret extraction, degeneration, 4-bit quantisation, relearning), and the per-record
verdict. Not the hash-chained audit log, which is the service's (lethe.service.domain.audit_log)."""
