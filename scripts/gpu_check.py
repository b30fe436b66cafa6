"""One GRAFT step of two small random-weight models on a GPU: :mod:`graft.bench.gpu_check` (``--help``)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing

from graft.bench.gpu_check import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
