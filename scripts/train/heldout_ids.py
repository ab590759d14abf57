"""heldout_ids.py — writes OUT/heldout-ids.txt: the token ids of OUT/heldout.txt (BOS first) from
sentencepiece through train_models.Tok, in the format of `kvtier tokenize --ids` ("[1, 2, ...]"), so
tests/e2e/trained_models.sh can diff kvtier's SPM tokenizer against sentencepiece."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_models import Tok  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "data/models"
tok = Tok(os.path.join(out, "tokenizer.model"))
ids = tok.encode(open(os.path.join(out, "heldout.txt")).read())
with open(os.path.join(out, "heldout-ids.txt"), "w") as f:
    f.write(json.dumps(ids) + "\n")
