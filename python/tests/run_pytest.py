"""ctest's entry to the Python tests (label python): pytest over this folder; exits 77 (skipped)
where pytest, NumPy, matplotlib or the built module is missing, with the reason."""
import sys

try:
    import numpy  # noqa: F401
    import pytest
    import matplotlib  # noqa: F401
    import pureattention  # noqa: F401
except ImportError as e:
    print(f"skipped: {e} (README \"Python\": pip install pytest numpy matplotlib)")
    sys.exit(77)

sys.exit(pytest.main(sys.argv[1:]))
