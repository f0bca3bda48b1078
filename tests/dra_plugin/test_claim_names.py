"""Claim references and request names are matched whole: a trailing newline is refused."""

from __future__ import annotations

import pytest

from enflame_gcu.dra_plugin import claims
from enflame_gcu.errors import ClaimError

GOOD = claims.ClaimRef("enflame", "c.d-1", "0f8c2f4e-1d2b-4c5a-9e7f-1234567890ab")


@pytest.mark.parametrize("field", ["namespace", "name", "uid"])
def test_a_trailing_newline_in_a_claim_reference_is_refused(field: str) -> None:
    values = {"namespace": GOOD.namespace, "name": GOOD.name, "uid": GOOD.uid}
    values[field] += "\n"
    with pytest.raises(ClaimError, match="refused a claim the kubelet named"):
        claims.check_ref(claims.ClaimRef(**values))
    claims.check_ref(GOOD)


def test_a_uid_with_a_trailing_newline_is_not_a_uid() -> None:
    assert claims.valid_uid(GOOD.uid)
    assert not claims.valid_uid(GOOD.uid + "\n")


def test_a_request_name_with_a_trailing_newline_is_refused() -> None:
    def claim(request: str) -> dict[str, object]:
        result = {"driver": "gcu.enflame.com", "request": request, "pool": "n", "device": "gcu-0"}
        return {
            "metadata": {"uid": GOOD.uid},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }

    found = claims.allocated_devices(GOOD, claim("gcus"), driver="gcu.enflame.com")
    assert [device.request for device in found] == ["gcus"]
    with pytest.raises(ClaimError, match="is not a DNS label"):
        claims.allocated_devices(GOOD, claim("gcus\n"), driver="gcu.enflame.com")
