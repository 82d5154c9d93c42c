"""What a shipped profile resolves to: its jobs and the plan's command lines, host-free.

The golden files in ``tests/fixtures/profiles_resolved/`` were written from the
profiles as they were before the profile language (include, inherits, matrix,
tags) rewrote them; ``tests/test_profile_language.py`` checks that the shipped
profiles still resolve to exactly these jobs and command lines. Regenerate one
only for an intended change of a test's definition::

    python tests/profile_golden.py profiles/standard.json \
        > tests/fixtures/profiles_resolved/standard.json
"""

import json
import os
import shlex
import sys

from milarun.host.devices import Devices
from milarun.plan.launches import plan_suite
from milarun.plan.nodes import local_cluster
from milarun.profile.language import load_profile

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "profiles_resolved")


def resolved(path):
    """Jobs of ``path`` with the launches of run 0 on two GPUs of a host named ``host``
    (python ``python``, dataroot ``/data``, outdir ``/out``, cgexec as ``cgexec``).

    Each command's ``--extra`` JSON is ``<extra>``: it is
    ``json.dumps({**extra, "job": definition}, sort_keys=True)`` (see :func:`extra_json`)."""
    jobs = load_profile(path)
    cluster = local_cluster(Devices("gpu", [0, 1]), name="host")
    out = {}
    for job in jobs:
        waves = plan_suite([job], cluster, 1, "/out", dataroot="/data", python="python")
        launches = []
        for wave in waves:
            for lch in wave:
                argv = list(lch.argv)
                if argv and os.path.basename(argv[0]) == "cgexec":
                    argv[0] = "cgexec"  # its path depends on the host
                # --extra holds the definition again: kept once, in "definition"
                i = argv.index("--extra") + 1
                extra = json.loads(argv[i])
                assert extra.pop("job") == job.definition
                argv[i] = "<extra>"
                launches.append(
                    {
                        "device": lch.device,
                        "group": lch.group,
                        "cgroup": lch.cgroup,
                        "concurrent": lch.concurrent,
                        "timeout": lch.timeout,
                        "env": lch.env,
                        "log": lch.log,
                        "result": str(lch.result_path),
                        "extra": extra,
                        "command": shlex.join(argv),
                    }
                )
        out[job.name] = {
            "full_name": job.full_name,
            "experiment": job.experiment,
            "definition": job.definition,
            "test_argv": shlex.join(job.argv()),
            "prepare": job.prepare,
            "exec_prefix": job.exec_prefix,
            "launches": launches,
        }
    return out


def extra_json(job, launch):
    """The exact ``--extra`` argument of a golden launch."""
    return json.dumps({**launch["extra"], "job": job["definition"]}, sort_keys=True)


def dumps(data):
    """The golden file's text: one job per block, one launch per line."""
    blocks = []
    for name, job in data.items():
        head = {k: v for k, v in job.items() if k != "launches"}
        lines = [json.dumps(lch, sort_keys=True) for lch in job["launches"]]
        text = json.dumps(head, indent=1)[:-2]
        text += ',\n "launches": [\n  ' + ",\n  ".join(lines) + "\n ]\n}"
        blocks.append(f"{json.dumps(name)}: " + text.replace("\n", "\n "))
    return "{\n " + ",\n ".join(blocks) + "\n}\n"


if __name__ == "__main__":
    sys.stdout.write(dumps(resolved(sys.argv[1])))
