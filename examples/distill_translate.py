"""Distil the encoder-decoder of `examples/translate.py` into a student with half the layers,
and compare exact match and decoding speed (survey §5.7).

What it shows: training a teacher `Seq2SeqLM` on `translate.py`'s task, then three students
with half the teacher's layers (encoder and decoder) trained for the same number of steps:
  - from scratch, on the labels only;
  - word-level distillation with `keras_xf.training.Distiller`: `α` · the label loss
    + `(1 − α)` · `T²` · KL(teacher ‖ student) at temperature `T`, padding excluded
    (`--hidden-weight` adds the MSE between the teacher's and the student's encoder and
    decoder outputs);
  - with `--sequence-level`, sequence-level distillation: the training sources translated by
    the teacher with beam search (`sequence_distillation_data`), then word-level distillation
    on those pairs.
Each model is scored by beam-search exact match on held-out sources, and its decoding speed
(generated tokens per second, after a warm-up call that compiles the decoding loop) is
measured on the same sources. Timings depend on the machine and its load.

Run (any backend):

    KERAS_BACKEND=jax python examples/distill_translate.py
    KERAS_BACKEND=jax python examples/distill_translate.py --sequence-level
    python examples/distill_translate.py --examples 64 --epochs 1 --eval-examples 8  # smoke test
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

import translate  # noqa: E402
from keras_xf.training import Distiller  # noqa: E402
from keras_xf.training import sequence_distillation_data  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Every option of examples/translate.py (data, teacher size, training, beams) "
               "is accepted too; the student takes the teacher's sizes but its depth.")
    parser.add_argument("--student-layers", type=int, default=None,
                        help="student depth (default: half the teacher's --num-layers)")
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--alpha", type=float, default=0.5, help="weight of the label loss")
    parser.add_argument("--hidden-weight", type=float, default=0.0,
                        help="weight of the hidden-state loss (0: word-level only)")
    parser.add_argument("--sequence-level", action="store_true",
                        help="also train a student on the teacher's beam-search outputs")
    ours, rest = parser.parse_known_args(argv)
    base = translate.parse_args(rest)
    for key, value in vars(ours).items():
        setattr(base, key, value)
    if base.student_layers is None:
        base.student_layers = max(1, base.num_layers // 2)
    return base


def decode_speed(model, test, source_length, target_length, num_beams):
    """`(exact match, generated tokens per second)` of beam search: a warm-up call compiles
    the loop (one per sampler object), the second call is timed."""
    sampler = keras_hub.samplers.BeamSampler(num_beams=num_beams)
    translate.translate(model, test[:1] * len(test), source_length, target_length, sampler)
    started = time.perf_counter()
    score, _, outputs = translate.translate(model, test, source_length, target_length, sampler)
    seconds = time.perf_counter() - started
    generated = int(np.asarray(outputs["decoder_padding_mask"]).sum()) - len(test)  # no [start]
    return score, generated / seconds


def distil(args, teacher, data, student, hidden):
    pairs = [("backbone/encoder_sequence_output",) * 2,
             ("backbone/decoder_sequence_output",) * 2] if hidden else None
    distiller = Distiller(teacher, student, temperature=args.temperature, alpha=args.alpha,
                          hidden_states=pairs, hidden_state_weight=args.hidden_weight)
    distiller.compile(optimizer=translate.make_optimizer(args), loss=translate.make_loss(args))
    x, y, sample_weight = data
    distiller.fit(x, y, sample_weight=sample_weight, batch_size=args.batch_size,
                  epochs=args.epochs, steps_per_epoch=args.steps, verbose=args.verbose)
    return distiller.student


def main(argv=None):
    args = parse_args(argv)
    started = time.perf_counter()
    translate.use_one_torch_thread()
    keras.utils.set_random_seed(args.seed)
    train, test, source_length, target_length, data = translate.make_data(args)
    x, y, sample_weight = data

    def fit(model, examples):
        keras.utils.set_random_seed(args.seed + 1)
        ex, ey, ew = examples
        model.fit(ex, ey, sample_weight=ew, batch_size=args.batch_size, epochs=args.epochs,
                  steps_per_epoch=args.steps, verbose=args.verbose)
        return model

    def student():
        keras.utils.set_random_seed(args.seed + 1)  # every student starts from the same weights
        return translate.build_model(args, source_length, target_length, args.student_layers)

    print(f"backend {keras.config.backend()}, task {args.task}, {len(train)} training / "
          f"{len(test)} held-out pairs; teacher {args.num_layers} layers, students "
          f"{args.student_layers} layers; T={args.temperature}, alpha={args.alpha}")
    teacher = fit(translate.build_model(args, source_length, target_length), data)
    rows = {"teacher": teacher}
    rows["student, from scratch"] = fit(student(), data)
    rows["student, word-level distillation"] = distil(args, teacher, data, student(),
                                                      args.hidden_weight > 0)
    if args.sequence_level:
        sources = {key: x[key] for key in ("encoder_token_ids", "encoder_padding_mask")}
        teacher_data = sequence_distillation_data(
            teacher, sources, max_length=target_length + 1, stop_token_ids=[translate.END],
            sampler=keras_hub.samplers.BeamSampler(num_beams=args.num_beams), batch_size=256)
        rows["student, sequence-level + word-level"] = distil(args, teacher, teacher_data,
                                                              student(), args.hidden_weight > 0)
    trained = time.perf_counter()

    print(f"{'model':<38} {'parameters':>10} {'exact match':>12} {'tokens/s':>10}")
    for name, model in rows.items():
        score, speed = decode_speed(model, test, source_length, target_length, args.num_beams)
        print(f"{name:<38} {model.count_params():>10} {score:>12.4f} {speed:>10.0f}")
    finished = time.perf_counter()
    print(f"exact match: beam search, {args.num_beams} beams, {len(test)} held-out sources; "
          f"every student trained {args.epochs} epochs")
    print(f"time: {finished - started:.1f} s (training {trained - started:.1f} s, "
          f"decoding {finished - trained:.1f} s)")


if __name__ == "__main__":
    main()
