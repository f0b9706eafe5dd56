"""Training utilities: schedules, losses and batching helpers."""

from keras_xf.training.batching import language_model_examples
from keras_xf.training.batching import pack_sequences
from keras_xf.training.batching import seq2seq_examples
from keras_xf.training.noam_schedule import NoamSchedule
from keras_xf.training.smoothed_cross_entropy import SmoothedSparseCrossEntropy
from keras_xf.training.time_limit import TimeLimit
