"""The service's domain: jobs and their lease, lineage (models and versions), connectivity curves, the audit
log, model sources, the sweeper, and the errors they raise. No web framework: the worker imports these too."""
