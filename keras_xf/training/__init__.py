"""Training utilities: schedules, losses, batching helpers, and distillation."""

from keras_xf.training.batching import language_model_examples
from keras_xf.training.chunked_cross_entropy import ChunkedCrossEntropy
from keras_xf.training.chunked_loss_model import ChunkedLossModel
from keras_xf.training.early_exit_loss import EarlyExitLoss
from keras_xf.training.early_exit_loss import final_exit_accuracy
from keras_xf.training.distiller import Distiller
from keras_xf.training.batching import pack_sequences
from keras_xf.training.batching import seq2seq_examples
from keras_xf.training.batching import stream_examples
from keras_xf.training.noam_schedule import NoamSchedule
from keras_xf.training.sequence_distillation import sequence_distillation_data
from keras_xf.training.stream_memory import StreamMemory
from keras_xf.training.smoothed_cross_entropy import SmoothedSparseCrossEntropy
from keras_xf.training.time_limit import TimeLimit
