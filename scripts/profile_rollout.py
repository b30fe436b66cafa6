"""Where a training rollout's time goes, per default model: :mod:`graft.bench.rollout_profile` (``--help``)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing

from graft.bench.rollout_profile import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
