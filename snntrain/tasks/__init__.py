"""LightningModules, one per task."""

from .base import SpikingTask
from .classification import ClassificationTask

TASKS = {"classify": ClassificationTask}

__all__ = ["TASKS", "ClassificationTask", "SpikingTask"]
