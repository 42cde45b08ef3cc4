"""One grid cell that spans several devices, in a process of its own.

`vapo-ablate --devices-per-cell K` (K > 1) runs each cell as `python -m vapo_lit.ablate.cell
CELL.json [--resume]`: Lightning's DDP/FSDP launcher starts ranks 1..K-1 by re-running this same
command line, which a worker process (spawned by multiprocessing, or the CLI's own process) could
not offer. The worker that claimed the cell keeps its heartbeat and watches this process; the
config is the cell's fully resolved `RunConfig` as JSON (written into the run folder).

Exit codes: 0 done (summary.json written by rank 0), 1 the run failed (one line on stderr),
3 disk full (so the worker hands the cell back instead of spending a retry), 130 interrupted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DISK_FULL = 3


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    resume = "--resume" in argv
    paths = [a for a in argv if a != "--resume"]
    if len(paths) != 1:
        print("usage: python -m vapo_lit.ablate.cell CELL.json [--resume]", file=sys.stderr)
        return 2
    from vapo_lit.config import from_dict
    from vapo_lit.faults import is_disk_full
    from vapo_lit.progress_line import quiet_libraries
    from vapo_lit.status import announcing
    from vapo_lit.train import train

    quiet_libraries()

    cfg = from_dict(json.loads(Path(paths[0]).read_text()))
    try:
        with announcing():  # what loads and builds before the first iteration, into the cell's cell.log
            train(cfg, resume=resume)
    except (KeyboardInterrupt, SystemExit):
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the worker records the line and retries the cell
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"{type(e).__name__}: {first}", file=sys.stderr)
        return DISK_FULL if is_disk_full(e) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
