"""Results of one machine map to one host, whatever each student saw."""

from milarun.analysis.summary import summarize
from milarun.formats.record import new_result


def result(device, cpuset, limit):
    rec = new_result(
        "s.t", f"0.{device}", device=str(device), devices=[device], plan_type="per-gpu"
    )
    rec["success"] = True
    rec["timings"]["train"]["samples"] = [
        {"start": i, "end": i + 1, "count": 10, "rate": 10.0, "warmup": i == 0} for i in range(5)
    ]
    rec["host"] = {
        "hostname": "node1",
        "cpu_model": "EPYC",
        "cpu_count": 64,
        "cpuset": cpuset,
        "memory_limit_mib": limit,
        "torch": "2.13.0",
        "cuda": "13.0",
        "gpus": [{"index": device, "name": "H100", "driver": "580.1"}],
    }
    return rec


def test_students_of_one_machine_are_one_host_with_all_gpus():
    records = [result(d, [d * 8 + i for i in range(8)], 1000.0 + d) for d in range(8)]
    summary = summarize(records)
    assert len(summary["hosts"]) == 1
    host = summary["hosts"][0]
    assert host["gpus"] == ["H100"] * 8
    assert host["hostname"] == "node1" and host["driver"] == "580.1"
