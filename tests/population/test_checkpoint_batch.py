"""foxdqn.population.checkpoint_batch: every member's checkpoint file from one pass over the host
copy, byte for byte what member_payload and encode write member by member."""
from __future__ import annotations

import copy

import pytest
import torch

from foxdqn.population.checkpoint import HostCopy, member_payload
from foxdqn.population.checkpoint_batch import member_files, write_member_files
from foxdqn.run.checkpoint import encode, load_checkpoint
from test_population import configs, run
from test_population_resume import LAYOUT_CASES, assert_payloads_equal

CASES = ["cartpole", "iqn_cql", "iql_c51", "attention_branching", "controls", "augment", "bitflip_her_per"]


def population(case: str, members: int = 3, best: bool = False):
    cfgs = configs(LAYOUT_CASES[case], [[f"seed={i}"] for i in range(members)])
    s = run(cfgs, iterations=2, collect_first=4)
    kept = None
    if best:  # early stopping's kept networks: other weights than the live ones
        kept = tuple(None if net is None else copy.deepcopy(net) for net in (s.online, s.target, s.value))
        with torch.no_grad():
            for t in kept[0].parameters():
                t.mul_(0.5)
    return s, kept


def arguments(s, loop: bool = True) -> list[dict]:
    """Per-member keyword arguments as the trainer's save() gives them (one member halted elsewhere)."""
    out = []
    for p in range(s.members):
        kw = dict(run_id=f"run{p}", config={"seed": p, "nested": {"x": [p, 1.5]}},
                  counts=(7, 3) if p == 1 else (int(s.env_steps), int(s.updates)))
        if loop:
            kw["loop"] = {"member": p, "rows": [[p, None]], "flag": p % 2 == 0}
        out.append(kw)
    return out


@pytest.mark.parametrize("case", CASES)
def test_member_files_are_byte_for_byte_those_written_member_by_member(case):
    s, best = population(case, best=case in ("cartpole", "controls"))
    host = HostCopy(s, best)
    members = arguments(s)
    files = dict(member_files(s, host, members))
    assert sorted(files) == list(range(s.members))
    for p, data in files.items():
        assert data == encode(member_payload(s, p, host=host, best=best, **members[p])), f"{case} member {p}"


def test_member_files_without_a_loop_and_written_files(tmp_path):
    """Files without a loop (no member_state) are the member-by-member files too; written
    atomically, each loads as the member-by-member payload."""
    s, _ = population("iqn_cql", members=4)
    host = HostCopy(s)
    for loop in (True, False):
        members = arguments(s, loop)
        whole = dict(member_files(s, host, members))
        for p in range(s.members):
            assert whole[p] == encode(member_payload(s, p, host=host, **members[p])), f"loop={loop} member {p}"
    paths = [tmp_path / f"m{p}" / "last.pt" for p in range(s.members)]
    write_member_files(s, host, paths, members)
    for p, path in enumerate(paths):
        assert_payloads_equal(load_checkpoint(path), member_payload(s, p, host=host, **members[p]), f"member {p}")


def test_member_files_refuses_what_it_cannot_write():
    s, _ = population("cartpole", members=2)
    host = HostCopy(s)
    with pytest.raises(ValueError, match="4 members' arguments for a population of 2"):
        list(member_files(s, host, arguments(s) * 2))  # 4 for 2
    mixed = arguments(s)
    del mixed[1]["loop"]
    with pytest.raises(ValueError, match="every member's file is resumable"):
        list(member_files(s, host, mixed))
    cfgs = configs([*LAYOUT_CASES["cartpole"], "checkpoint.save_replay=true"], [["seed=0"], ["seed=1"]])
    r = run(cfgs, iterations=1, collect_first=4)
    with pytest.raises(ValueError, match="save_replay"):
        list(member_files(r, HostCopy(r), arguments(r)))


def test_member_state_dicts_are_the_members_state_dicts():
    """member_state_dict(p) is entry p of member_state_dicts(), a contiguous copy (the classic layout)."""
    s, _ = population("attention_branching", members=3)
    for net in (s.online, s.target):
        stacks = net.member_state_dicts()
        for p in range(3):
            one = net.member_state_dict(p)
            assert one.keys() == stacks.keys()
            for key, t in one.items():
                assert t.is_contiguous() and torch.equal(t, stacks[key][p]), key
                assert t.untyped_storage().data_ptr() != stacks[key].untyped_storage().data_ptr(), key
