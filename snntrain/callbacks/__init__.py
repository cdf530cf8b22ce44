"""The run's Lightning callbacks, one module per section of ``conf/callbacks/default.yaml`` (``checkpoint``,
``precise_bn``, ``ema``, ``efficiency``), and the logging, progress and resume helpers the CLI adds beside them.
Every public name is importable from here (``snntrain.callbacks.PreciseBatchNorm``)."""

from .checkpoint import AtomicCheckpointIO, IntervalCheckpoint, RunCheckpoint
from .efficiency import FiringRateMonitor
from .ema import ExponentialMovingAverage, ema_decay
from .metrics import batch_size, log_position, publish
from .precise_bn import PreciseBatchNorm, recompute_batchnorm, running_stat_modules
from .progress import ProgressBar
from .resume import ExactResume
from .speed import TrainingSpeedMonitor, synchronized_clock
from .tensorboard import BatchedTensorBoardLogger, add_histograms, add_png, fast_record_checksums, hparam_values

__all__ = [
    "AtomicCheckpointIO", "BatchedTensorBoardLogger", "ExactResume", "ExponentialMovingAverage", "FiringRateMonitor",
    "IntervalCheckpoint", "PreciseBatchNorm", "ProgressBar", "RunCheckpoint", "TrainingSpeedMonitor", "add_histograms",
    "add_png", "batch_size", "ema_decay", "fast_record_checksums", "hparam_values", "log_position", "publish",
    "recompute_batchnorm", "running_stat_modules", "synchronized_clock",
]
