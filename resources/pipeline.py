"""The pipeline configuration as a Dagster resource."""

from __future__ import annotations

from dagster import ConfigurableResource

from pipeline.config import PipelineConfig, load_config


class DblogConfigResource(ConfigurableResource):  # type: ignore[type-arg]
    """Points at the ``dblog`` YAML config; secrets stay in the environment it names."""

    config_path: str = "dblog.yaml"

    def load(self) -> PipelineConfig:
        return load_config(self.config_path)
