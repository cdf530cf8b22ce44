"""LightningModules, one per task."""

from .base import SpikingTask
from .classification import ClassificationTask
from .detection import DetectionTask

TASKS = {"classify": ClassificationTask, "detect": DetectionTask}

__all__ = ["TASKS", "ClassificationTask", "DetectionTask", "SpikingTask"]
