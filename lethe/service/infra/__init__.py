"""What the service keeps and sends things through: the database (engine, sessions, tables), the artifact store,
the Celery queue and the embedded filesystem broker, and the scrub of erased data's leftovers."""
