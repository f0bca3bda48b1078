"""Leader election on a Lease: one of two replicas leads; the other takes over on expiry."""

from __future__ import annotations

from enflame_gcu.gcu_operator import api, leader
from tests.gcu_operator.fake_api import FakeApi


def test_two_replicas_one_leader_then_takeover_after_expiry() -> None:
    fake = FakeApi()
    a = leader.LeaderElector(fake, "kube-system", "a", duration=15)
    b = leader.LeaderElector(fake, "kube-system", "b", duration=15)
    now = fake.now
    assert a.try_acquire(now)
    assert not b.try_acquire(now + 1)
    assert a.try_acquire(now + 10)  # renewal
    assert not b.try_acquire(now + 20)  # b sees the renewal at +20: valid until +35 for b
    assert not b.try_acquire(now + 34)
    assert b.try_acquire(now + 36)  # a stopped renewing
    assert not a.try_acquire(now + 37)
    lease = fake.find(api.LEASE, leader.LEASE_NAME, "kube-system")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1


def test_racing_for_an_expired_lease_only_one_wins() -> None:
    fake = FakeApi()
    a = leader.LeaderElector(fake, "kube-system", "a")
    assert a.try_acquire(fake.now)
    b = leader.LeaderElector(fake, "kube-system", "b")
    c = leader.LeaderElector(fake, "kube-system", "c")
    stale = fake.find(api.LEASE, leader.LEASE_NAME, "kube-system")
    assert stale is not None
    # c read the Lease before b wrote it: its PUT carries a stale resourceVersion.
    original_get = fake.get
    # Both saw the Lease at +1 and nothing changed for a Lease's duration.
    assert not b.try_acquire(fake.now + 1)
    assert not c.try_acquire(fake.now + 1)
    fake.get = lambda kind, name, namespace=None: stale  # type: ignore[method-assign]
    assert b.try_acquire(fake.now + 100)
    assert not c.try_acquire(fake.now + 100)
    fake.get = original_get  # type: ignore[method-assign]
    lease = fake.find(api.LEASE, leader.LEASE_NAME, "kube-system")
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"


def test_release_lets_a_standby_take_over_at_once() -> None:
    fake = FakeApi()
    a = leader.LeaderElector(fake, "kube-system", "a")
    b = leader.LeaderElector(fake, "kube-system", "b")
    assert a.try_acquire(fake.now)
    a.release()
    assert b.try_acquire(fake.now + 1)


def test_a_leader_renews_with_one_put_and_reads_again_only_after_a_conflict() -> None:
    # Issue 38: a converged operator made 58 Lease requests a minute (a GET and a PUT every
    # 2 s). Now one PUT per renewal, and the default period is 10 s: 6 a minute.
    fake = FakeApi()
    a = leader.LeaderElector(fake, "kube-system", "a", duration=40, renew_deadline=30)
    assert a.try_acquire(fake.now)
    fake.calls.clear()
    for step in range(1, 7):  # a minute of renewals at the 10 s default
        assert a.try_acquire(fake.now + 10 * step)
    assert fake.calls == [("replace", "Lease")] * 6, fake.calls
    # Someone else wrote the Lease (an admin, or a standby after a pause): our PUT gets a 409,
    # the Lease is read, and its other holder stands.
    lease = fake.find(api.LEASE, leader.LEASE_NAME, "kube-system")
    assert lease is not None
    lease["spec"]["holderIdentity"] = "b"
    fake.replace(api.LEASE, lease)
    fake.calls.clear()
    assert not a.try_acquire(fake.now + 70)
    assert fake.calls == [("replace", "Lease"), ("get", "Lease")], fake.calls
    assert not a.leading(fake.now + 70)


def test_a_renewal_after_the_deadline_reads_the_lease_first() -> None:
    fake = FakeApi()
    a = leader.LeaderElector(fake, "kube-system", "a", duration=40, renew_deadline=30)
    assert a.try_acquire(fake.now)
    fake.calls.clear()
    # The API server was away for longer than the renew deadline: a standby may have taken
    # over, so this replica does not build on its old write.
    assert a.try_acquire(fake.now + 31)
    assert fake.calls[0] == ("get", "Lease"), fake.calls
