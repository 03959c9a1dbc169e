"""Run under `accelerate launch` by tests/test_multiprocess.py: writes its process id to OUT, then hangs."""

import os
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
(out / f"pid-{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))
time.sleep(3600)
