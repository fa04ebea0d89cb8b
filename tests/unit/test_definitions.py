"""The Dagster workspace entry point loads."""

from dagster import Definitions


def test_definitions_load() -> None:
    from pipeline.definitions import defs

    assert isinstance(defs, Definitions)
    assert "dblog" in defs.resources
