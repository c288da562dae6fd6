"""A save that meets a reconfiguration (issue 19, item 5; docs/decisions.md, "A step
written during a reconfiguration"): the mount refuses partition and `step` writes
with EBUSY while a reconfiguration is preparing; rank.save waits for it, bounded
(rank.busy_wait, or wait=): aborted, the save goes on and completes; committed, the
save raises ESTALE (the rank's layout is gone) and the step every rank saved before
stays; still preparing at the bound, it raises EBUSY."""
import errno
import threading
import time

import pytest
import torch

from test_python import NAMES, Job, config, grads, small_schema
from test_reconf import ctl, prepare, wait_state

import mlfs


def later(seconds, fn):
    """Runs fn() on a thread after @seconds; join() it, then check .error."""
    th = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
    th.start()
    return th


def saved_job(mount):
    """A job of one rank that saved step 1; (mount, rank, job)."""
    mnt = mlfs.Mount(mount.path)
    mnt.set_up(small_schema(), config(1, 1))
    me = mnt.rank(0)
    job = Job(1, seed=1, main=False)
    job.step(grads(1, 0, seed=2))
    job.save(me, 1)
    return mnt, me, job


def prepared_job(mount):
    mnt, me, job = saved_job(mount)
    assert prepare(mount, config(2, 2))[0] == 0
    wait_state(mount, "prepared")
    job.step(grads(1, 0, seed=3))
    return mnt, me, job


def test_save_waits_for_an_aborted_reconfiguration(mount):
    mnt, me, job = prepared_job(mount)
    results = []
    th = later(0.3, lambda: results.append(ctl(mount, op="abort", version=2, reason="test")))
    t0 = time.monotonic()
    job.save(me, 2)  # refused with EBUSY at its first partition, waits, then saves
    waited = time.monotonic() - t0
    th.join()
    assert results[0][0] == 0 and waited >= 0.25, (results, waited)
    assert me.saved_step() == 2
    for (state, name), want in job.state().items():  # the new values, every partition
        got = me.load(state, name, mapped=False)
        assert torch.equal(got, want.to(got.dtype)), (state, name)
    assert mnt.reconfigure({"tp": 2})["to_version"] == 2  # and the job goes on


def test_save_fails_when_the_reconfiguration_commits(mount):
    mnt, me, job = prepared_job(mount)
    th = later(0.3, lambda: ctl(mount, op="commit", version=2))
    with pytest.raises(mlfs.MlfsError, match="layout changed from version 1 to 2") as e:
        job.save(me, 2)
    th.join()
    assert e.value.errno == errno.ESTALE and "ranks/0/model/" in str(e.value)
    mnt.wait_version(2)
    assert [mnt.rank(r).saved_step() for r in mnt.ranks()] == [1, 1]  # the common step


def test_save_fails_after_its_bound(mount):
    mnt, me, job = prepared_job(mount)
    t0 = time.monotonic()
    with pytest.raises(mlfs.MlfsError, match=r"in progress \(prepared\) \(waited 0.3 s") as e:
        me.save(job.model, job.opt, 2, names=NAMES, wait=0.3)
    assert e.value.errno == errno.EBUSY and 0.3 <= time.monotonic() - t0 < 5
    assert me.saved_step() == 1
    assert ctl(mount, op="abort", version=2, reason="test")[0] == 0
    me.mark_step(1)  # writes are open again


def test_a_writer_of_an_old_layout_writes_nothing(mount):
    """A rank that did not notice a reconfiguration (committed while it computed, as an
    elastic job's controller does) saves after it: its paths exist in the new layout
    (dp 1 -> 2 keeps rank 0's partitions, at the step the new layout was built from), so
    without the package's check its save would write them there. It raises ESTALE
    before the first open, and every partition and the step are the new layout's
    (docs/decisions.md, "A writer of an old layout")."""
    mnt, me, job = saved_job(mount)
    before = {(s, n): me.load(s, n, mapped=False).clone() for s, n in job.state()}
    mnt.reconfigure({"dp": 2})  # version 2: rank 0 keeps its tensors, at step 1
    job.step(grads(1, 0, seed=3))
    with pytest.raises(mlfs.MlfsError, match="layout is version 2, not this rank's 1") as e:
        job.save(me, 2)
    assert e.value.errno == errno.ESTALE
    now = mnt.rank(0)
    assert now.version == 2 and now.saved_step() == 1
    for key, want in before.items():  # nothing of the stale save reached the new layout
        assert torch.equal(now.load(*key, mapped=False), want), key
    job.save(now, 2)  # a rank of the new layout saves
    assert now.saved_step() == 2


def test_no_reconfiguration_during_a_save(mount):
    """A save in progress: rank 0 saved step 1, then wrote a partition of its next save,
    not yet its step. A reconfiguration then would build the new layout from that
    partition (step 2's values) and call it step 1's: it is refused, naming the rank,
    and nothing changes. Once the step is written the same change commits, carrying the
    partition written."""
    mnt, me, job = saved_job(mount)
    job.step(grads(1, 0, seed=3))
    name = "layers/0/fc/weight"
    new = job.state()[("model", name)]
    me.save("model", name, new)  # the first partition of the save of step 2
    with pytest.raises(mlfs.MlfsError, match="rank 0 is saving: a partition was written "
                                             "after its step 1"):
        mnt.reconfigure({"dp": 2})
    assert mnt.config()["version"] == 1 and mnt.status()["state"] in ("idle", "failed")
    job.save(me, 2)  # the save completes
    assert mnt.reconfigure({"dp": 2})["to_version"] == 2
    got = mnt.rank(0).load("model", name, mapped=False)
    assert torch.equal(got, new.to(got.dtype)) and mnt.rank(1).saved_step() == 2

