"""
PTB with repeated random spans: a corpus meant to teach a small transformer to copy, so that the recall probe
(experiments/recall.py) has something a fixed-size state could lose (at the study's sizes it has not, yet: below).

    python experiments/repeat_corpus.py                        # writes data/ptb-repeats/{train,valid,test}.txt
    python train_lm.py --dataset data/ptb-repeats ...          # then train and probe as on PTB

Trained on PTB as it is, the study's 4-layer teacher never learns to copy: a span repeated 8 tokens later is
predicted no better than on its first reading, so no model has recall to lose. Repeating PTB's own lines did not
teach it either (800 steps: 0.19 on the repeat against 0.19 on the first reading), nor did a line of 8 to 24
random words after every 2nd line, repeated within 8 lines, over the full 2,400 steps (measured 2026-11-24: 0.06 on
the spans' second reading in train.txt, as on their first, the line's end alone; 0.19 against 0.19 on
validation text). Copying (induction heads, Olsson et al., 2022) is learned late, after a plateau, and sooner the
more of the text rewards it: a 2-layer model on nothing but random sequences, each shown twice, learned it after
about 1,100 steps, at a vocabulary of 64 as of 10,000. So by default every training line (--every 1) is followed
by a line of 16 to 48 random PTB words (--words 32), and that line comes again after 0 or 1 more lines of text
(--back 2): about a third of the tokens are such repeats, which only copying predicts. That did not teach the study's
teacher either (measured 2026-11-24, 2,400 steps: 0.031 on the spans' second reading in train.txt, as on their
first, at steps 800 and 1,500; the recall probe 0.176 on the repeat against 0.183 on the first reading at D = 8).
valid.txt and test.txt are PTB's own, unchanged: the probe and the perplexities read the same text as for the
models trained on PTB.
"""

import argparse
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from data import load_corpus  # noqa: E402
from runtime import Parser, atomic_write, positive_int, run_main, seed  # noqa: E402

REPEATS_DIR = os.path.join(ROOT, "data", "ptb-repeats")
EVERY, BACK, WORDS = 1, 2, 32  # the study's corpus: a span after every line, repeated within 2, of 16 to 48 words


def layout(every: int = EVERY, back: int = BACK, words: int = WORDS) -> str:
    """The corpus in words, for the report: 'a line of 16 to 48 random words after every training line, ...'."""
    where = "every training line" if every == 1 else f"every {every} training lines"
    again = "right after it" if back == 1 else f"0 to {back - 1} lines of text after it"
    return f"a line of {max(1, words // 2)} to {3 * words // 2} random words after {where}, repeated {again}"


def with_random_spans(lines: list, every: int, back: int, words: int = WORDS, seed: int = 0) -> list:
    """After every `every`-th line, a line of random words from `lines`; it comes again after 0 to `back` - 1 more
    lines of text (the copies of spans that fall past the end come at the end)."""
    rng = random.Random(seed)
    vocabulary = sorted({w for line in lines for w in line.split()})
    copies = {}  # line index -> the spans repeated after it
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        if (i + 1) % every == 0:
            span = " ".join(rng.choices(vocabulary, k=rng.randint(max(1, words // 2), 3 * words // 2)))
            out.append(span)
            copies.setdefault(min(i + rng.randrange(back), len(lines) - 1), []).append(span)
        out.extend(copies.pop(i, []))
    return out


def write_corpus(folder: str = REPEATS_DIR, every: int = EVERY, back: int = BACK, words: int = WORDS, seed: int = 0):
    """folder/train.txt with repeated spans, valid.txt and test.txt as PTB's; the same files for the same flags."""
    for split, text in load_corpus("ptb").items():
        lines = original = text.splitlines()
        if split == "train":
            lines = with_random_spans(original, every, back, words, seed)
            print(f"{folder}/train.txt: PTB's {len(original):,} lines and {len(lines) - len(original):,} lines of "
                  f"random words, each twice; valid.txt and test.txt: PTB's")
        path, text = os.path.join(folder, f"{split}.txt"), "\n".join(lines) + "\n"
        if os.path.isfile(path) and open(path).read() == text:
            continue  # left as it is: its time stamp says when the corpus last changed
        with atomic_write(path) as tmp, open(tmp, "w") as f:
            f.write(text)


def main(argv=None):
    p = Parser(prog="experiments/repeat_corpus.py", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=REPEATS_DIR, help="the folder written")
    p.add_argument("--every", type=positive_int, default=EVERY, help="a random span after every N-th training line")
    p.add_argument("--back", type=positive_int, default=BACK, help="its copy comes after 0 to N - 1 lines of text")
    p.add_argument("--words", type=positive_int, default=WORDS, help="a span has N / 2 to 3 N / 2 random words")
    p.add_argument("--seed", type=seed, default=0, help="the spans' words and the copies' places")
    args = p.parse_args(argv)
    write_corpus(args.out, args.every, args.back, args.words, args.seed)


if __name__ == "__main__":
    run_main(main)
