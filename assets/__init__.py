"""Dagster assets, checks, sensors and schedules: thin wiring of the ``dblog`` engine."""
