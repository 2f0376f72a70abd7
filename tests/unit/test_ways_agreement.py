"""The destroy's agreement on ways and settings: only what differs travels back (issue 33).

Each rank says, per group it is a member of, which way it holds it by, and the settings that
chose it. At production size every rank reads the merged answer, so the merge returns only the
groups and settings that differ: the oracle is the byte size of what every rank reads, measured
at 8 and at 4,096 ranks, and the ranks the merge names.
"""

from __future__ import annotations

import json

from reloadpg_autopatch.groups.agreement import FREE, KEEP, DestroyAnswers


def _entries(
    world: int, *, odd: dict[int, tuple[str, str]] | None = None, odd_common: str | None = None
) -> list[bytes]:
    """Every rank's destroy answers in a world of ``world`` ranks, Megatron-like: a tensor-
    parallel group of 8 and a data-parallel group of ``world // 8`` per rank, all suspending;
    ``odd``: ranks that hold their groups by another way, with a setting of their own."""
    odd = odd or {}
    out = []
    for rank in range(world):
        answers = DestroyAnswers()
        way, cumem = odd.get(rank, ("suspend", ""))
        common = FREE + KEEP if way == "behind a wrapper" else KEEP
        if rank in odd and odd_common is not None:
            common = odd_common
        tp, dp = 1 + rank // 8, 1 + world // 8 + rank % 8
        answers.ways = {str(tp): [way, 8, common], str(dp): [way, world // 8, common]}
        answers.settings = {"SLIME_RELOADABLE_PG_MODE": "auto", "NCCL_CUMEM_ENABLE": cumem}
        out.append(answers.payload())
    return out


def test_the_happy_path_reads_the_same_few_bytes_at_any_world_size() -> None:
    """Ranks that agree: the merged ways and settings are empty, so what every rank reads does
    not grow from 8 to 4,096 ranks (nor does what it writes)."""
    read = {}
    for world in (8, 4096):
        entries = _entries(world)
        merged = json.loads(DestroyAnswers.merge(entries))
        assert merged["ways"] == {}, world
        assert merged["settings"] == {}, world
        read[world] = len(json.dumps({"ways": merged["ways"], "settings": merged["settings"]}))
        assert max(map(len, entries)) < 400, world
    assert read[8] == read[4096], read


def test_a_rank_that_differs_is_named_with_its_group_its_way_and_its_setting() -> None:
    """Rank 9 holds its groups behind a wrapper with ``NCCL_CUMEM_ENABLE=0``: only its two
    groups come back, each with the ways and their ranks, and the setting with its values;
    the tensor-parallel group is kept awake (its peers hold torch's own object)."""
    answers = DestroyAnswers.read(
        DestroyAnswers.merge(_entries(64, odd={9: ("behind a wrapper", "0")}))
    )
    assert sorted(answers.ways) == ["10", "2"], answers.ways
    tp = answers.ways["2"]
    assert tp["size"] == 8
    assert tp[FREE] is False
    assert tp[KEEP] is True
    assert set(tp["ways"]) == {"suspend", "behind a wrapper"}
    assert answers.settings == {
        "NCCL_CUMEM_ENABLE": {
            "": {"runs": [[0, 8], [10, 63]], "names": []},
            "0": {"runs": [[9, 9]], "names": []},
        }
    }


def test_a_member_that_holds_no_way_makes_its_group_differ() -> None:
    """A member that refused a group at its creation, or left it awake, says nothing of it:
    the group still comes back (fewer answers than members), and cannot be freed behind its
    wrapper although every member that answered holds it behind one (the silent member would
    never create it again)."""
    entries = _entries(16, odd={r: ("behind a wrapper", "") for r in range(16)})
    silent = DestroyAnswers()
    silent.settings = {"SLIME_RELOADABLE_PG_MODE": "auto", "NCCL_CUMEM_ENABLE": ""}
    entries[3] = silent.payload()
    merged = DestroyAnswers.read(DestroyAnswers.merge(entries))
    assert sorted(merged.ways) == ["1", "6"], merged.ways  # rank 3's two groups
    assert merged.ways["1"][FREE] is False
    assert merged.ways["1"][KEEP] is True
    assert merged.settings == {}


def _settled(mode_name: str, odd: dict[int, tuple[str, str]], common: str | None = None):
    """``ways.common.settle`` on the merged answers of 16 ranks, in ``mode_name`` on this rank;
    ``common``: what the odd ranks' way can take instead of what its name gives."""
    from types import SimpleNamespace

    from reloadpg_autopatch.groups import settings
    from reloadpg_autopatch.groups.ways import common as ways_common

    entries = _entries(16, odd=odd, odd_common=common)
    run = SimpleNamespace(agreed=DestroyAnswers.read(DestroyAnswers.merge(entries)), shared=None)
    held = settings.current()
    saved, held.mode = held.mode, mode_name
    try:
        ways_common.settle(run)
    finally:
        held.mode = saved
    return run.shared


def test_suspend_mode_refuses_naming_each_way_with_its_ranks_and_the_setting() -> None:
    """The refusal names every way the members hold the group by, each with its ranks, and
    the setting that differs with its values and ranks (docs/suspend.md, docs/api.md)."""
    import pytest

    from reloadpg_autopatch.errors import ModeRefusedError

    with pytest.raises(ModeRefusedError) as caught:
        _settled("suspend", {9: ("behind a wrapper", "0")})
    text = str(caught.value)
    assert "group '2' ('behind a wrapper' on ranks 9; 'suspend' on ranks 8, 10, 11," in text, text
    assert "'behind a wrapper' on ranks 9" in text, text
    assert "NCCL_CUMEM_ENABLE=0 on ranks 9" in text, text


def test_auto_refuses_a_group_with_no_way_every_member_can_take() -> None:
    """In ``auto``, a group whose members share no common way (one holds it by a way that can
    neither be freed behind a wrapper nor kept awake) is refused on every rank, naming it;
    one they share gets its common way."""
    import pytest

    from reloadpg_autopatch.errors import ModeRefusedError

    with pytest.raises(ModeRefusedError, match="no way every member can take") as caught:
        _settled("auto", {9: ("stuck way", "")}, common="")
    assert "'2'" in str(caught.value), caught.value  # rank 9's tensor-parallel group
    assert _settled("auto", {9: ("behind a wrapper", "")}) == {"2": KEEP, "4": KEEP}
