"""Issue 13's four wiring bugs, planted one at a time in a scratch copy of the repository: each must
fail at least one of its mapped tests. Prints one line per bug (exit code, seconds, the first failing
test) and exits 1 if any bug passed its tests. The working tree is never changed.

    .venv/bin/python tools/plant_wiring_bugs.py
"""
import os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent
BUGS = [
    ("1 critic values one column late", "vapo_lit/passes.py",
     "    return critic(input_ids, attention_mask)[:, prompt_width - 1:]\n",
     "    v = critic(input_ids, attention_mask)\n    return torch.cat([v[:, prompt_width:], v[:, -1:]], 1)\n",
     ["tests/test_stages.py", "tests/test_components.py"]),
    ("2 critic targets with lambda_policy", "vapo_lit/experience.py",
     "    lam_critic = lam_policy if s.lam_critic is None else s.lam_critic\n",
     "    lam_critic = lam_policy\n",
     ["tests/test_stages.py", "tests/test_components.py"]),
    ("3 clip_higher setup sets eps_high = eps", "vapo_lit/components/clip_higher.py",
     "class ClipHigher(Component):\n",
     "class ClipHigher(Component):\n    def setup(self, trainer, pl_module, stage):\n        super().setup(trainer, pl_module, stage)\n        pl_module.switches.eps_high = pl_module.cfg.ppo.eps\n\n",
     ["tests/test_components.py"]),
    ("4 claim UPDATE without state = WAITING", "vapo_lit/ablate/store.py",
     "                     .filter(cols.trial_id == trial_id, cols.state == frm)\n",
     "                     .filter(cols.trial_id == trial_id)\n",
     ["tests/test_claim.py"]),
]
survived = []
for name, path, old, new, tests in BUGS:
    tmp = Path(tempfile.mkdtemp()) / "p"
    shutil.copytree(SRC, tmp, ignore=shutil.ignore_patterns(".venv", "runs", ".git", "__pycache__"))
    f = tmp / path
    s = f.read_text()
    assert s.count(old) == 1, (name, s.count(old))
    f.write_text(s.replace(old, new))
    where = subprocess.run([sys.executable, "-c", "import vapo_lit; print(vapo_lit.__file__)"], cwd=tmp,
                           capture_output=True, text=True, env={"PYTHONPATH": str(tmp)}).stdout.strip()
    assert where.startswith(str(tmp)), where
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                       cwd=tmp, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp)})
    failed = [l for l in r.stdout.splitlines() if l.startswith("FAILED")]
    print(f"bug {name}: exit {r.returncode} in {time.time()-t0:.0f}s; {failed[:2] or r.stdout.strip().splitlines()[-1]}", flush=True)
    shutil.rmtree(tmp.parent)
    if r.returncode == 0:
        survived.append(name)
if survived:
    print(f"not caught: {', '.join(survived)}")
sys.exit(1 if survived else 0)
