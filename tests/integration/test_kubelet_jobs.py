"""Jobs and CronJobs run by the embedded controller-manager and kubelet."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from scalable_topics.localcluster.cron import CronSchedule
from scalable_topics.localcluster.restclient import CRONJOBS, JOBS, PODS

from .kubelet_harness import Harness, JsonObj, eventually, running_cluster, sleeper_container

pytestmark = pytest.mark.integration

NS = "default"


def job_spec(seconds: float, exit_code: int, completions: int = 1, backoff: int = 6) -> JsonObj:
    return {
        "completions": completions,
        "parallelism": 2,
        "backoffLimit": backoff,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [sleeper_container(seconds, exit_code)],
            }
        },
    }


def job(name: str, **kwargs: float) -> JsonObj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": job_spec(**kwargs),  # type: ignore[arg-type]
    }


def condition(obj: JsonObj, ctype: str) -> JsonObj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return dict(c)
    return None


async def finished_job(h: Harness, name: str, ctype: str) -> JsonObj:
    async def probe() -> JsonObj | None:
        j = await h.client.get_or_none(JOBS, NS, name)
        return j if j and condition(j, ctype) else None

    return await eventually(probe, what=f"job {name} {ctype}")


async def test_job_runs_to_completion(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as h:
        await h.client.create(JOBS, NS, job("ok", seconds=0.1, exit_code=0, completions=3))
        j = await finished_job(h, "ok", "Complete")
        assert j["status"]["succeeded"] == 3
        assert j["status"]["active"] == 0
        assert "completionTime" in j["status"] and "startTime" in j["status"]
        pods, _ = await h.client.list(PODS, NS, label_selector="job-name=ok")
        assert len(pods) == 3 and all(p["status"]["phase"] == "Succeeded" for p in pods)
        term = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 0 and term["reason"] == "Completed"


async def test_job_fails_after_backoff_limit(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as h:
        await h.client.create(JOBS, NS, job("bad", seconds=0, exit_code=3, backoff=1))
        j = await finished_job(h, "bad", "Failed")
        assert condition(j, "Failed")["reason"] == "BackoffLimitExceeded"  # type: ignore[index]
        assert j["status"]["failed"] >= 2
        assert j["status"].get("succeeded", 0) == 0


def cronjob(name: str, policy: str, seconds: float) -> JsonObj:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedule": "*/1 * * * *",
            "concurrencyPolicy": policy,
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 1,
            "jobTemplate": {"spec": job_spec(seconds, 0)},
        },
    }


async def owned_jobs(h: Harness, cj_name: str) -> list[JsonObj]:
    items, _ = await h.client.list(JOBS, NS)
    return sorted(
        (
            j
            for j in items
            if any(r.get("name") == cj_name for r in j["metadata"].get("ownerReferences") or [])
            and not j["metadata"].get("deletionTimestamp")
        ),
        key=lambda j: j["metadata"]["name"],
    )


async def observed(h: Harness, name: str) -> None:
    """Wait until the CronJob controller's informer has the object (sync passes use its cache)."""

    async def probe() -> bool:
        return (NS, name) in h.kubelet.controllers.informers["CronJob"].cache

    await eventually(probe, what=f"cronjob {name} observed")


async def next_minute(h: Harness) -> str:
    """Move the controller clock past the next schedule time, run a pass; return that time."""
    schedule = CronSchedule.parse("*/1 * * * *")
    due = schedule.next_after(h.clock())
    h.clock.offset += due - h.clock() + timedelta(seconds=1)
    await h.kubelet.sync_cronjobs()
    return due.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_cronjob_schedules_jobs_and_keeps_history(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as h:
        await h.client.create(CRONJOBS, NS, cronjob("tick", "Allow", 0.1))
        await observed(h, "tick")
        first = await next_minute(h)
        jobs = await owned_jobs(h, "tick")
        assert len(jobs) >= 1
        cj = await h.client.get(CRONJOBS, NS, "tick")
        assert cj["status"]["lastScheduleTime"] == first
        await finished_job(h, jobs[-1]["metadata"]["name"], "Complete")

        second = await next_minute(h)
        assert second > first
        latest = (await owned_jobs(h, "tick"))[-1]["metadata"]["name"]
        await finished_job(h, latest, "Complete")

        async def history_trimmed() -> list[JsonObj] | None:
            await h.kubelet.sync_cronjobs()
            jobs = await owned_jobs(h, "tick")
            return jobs if [j["metadata"]["name"] for j in jobs] == [latest] else None

        await eventually(history_trimmed, what="only the latest successful job kept")

        async def last_success() -> bool:
            cj = await h.client.get(CRONJOBS, NS, "tick")
            return bool(cj["status"].get("lastSuccessfulTime")) and not cj["status"].get("active")

        await eventually(last_success, what="cronjob lastSuccessfulTime")


async def test_cronjob_concurrency_policies(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as h:
        await h.client.create(CRONJOBS, NS, cronjob("forbid", "Forbid", 3600))
        await h.client.create(CRONJOBS, NS, cronjob("replace", "Replace", 3600))
        await observed(h, "forbid")
        await observed(h, "replace")
        await next_minute(h)
        forbid_first = [j["metadata"]["name"] for j in await owned_jobs(h, "forbid")]
        replace_first = [j["metadata"]["name"] for j in await owned_jobs(h, "replace")]
        assert len(forbid_first) == 1 and len(replace_first) == 1

        await next_minute(h)
        assert [j["metadata"]["name"] for j in await owned_jobs(h, "forbid")] == forbid_first
        replaced = [j["metadata"]["name"] for j in await owned_jobs(h, "replace")]
        assert len(replaced) == 1 and replaced != replace_first
        cj = await h.client.get(CRONJOBS, NS, "replace")
        assert [a["name"] for a in cj["status"]["active"]] == replaced

        await h.client.patch(CRONJOBS, NS, "replace", {"spec": {"suspend": True}})

        async def suspended_seen() -> bool:
            return bool(
                (h.kubelet.controllers.informers["CronJob"].cache.get((NS, "replace")) or {})
                .get("spec", {})
                .get("suspend")
            )

        await eventually(suspended_seen, what="suspend observed")
        await next_minute(h)
        assert [j["metadata"]["name"] for j in await owned_jobs(h, "replace")] == replaced
