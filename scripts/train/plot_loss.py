"""plot_loss.py LOG... -o DIR — loss.tsv and loss.png from train_models.py logs (the lines
"[name] step S/N loss L ... [test T]"), for runs whose models were trained in separate processes
(train_models.py --only). train_models.py writes the same files itself when it trains both."""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_models import loss_png  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("logs", nargs="+")
ap.add_argument("-o", "--out", default="data/models")
args = ap.parse_args()
curve = []
pat = re.compile(r"\[(\w+)\] step (\d+)/\d+ loss ([0-9.]+) .*?(?: test ([0-9.]+))?$")
for path in args.logs:
    for line in open(path):
        m = pat.search(line.strip())
        if m:
            curve.append((m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4)) if m.group(4) else None))
loss_png(curve, os.path.join(args.out, "loss.png"))
with open(os.path.join(args.out, "loss.tsv"), "w") as f:
    f.write("model\tstep\ttrain_loss\ttest_loss\n")
    for n, s, l, t in curve:
        f.write(f"{n}\t{s}\t{l:.5f}\t{'' if t is None else f'{t:.5f}'}\n")
